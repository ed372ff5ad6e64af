"""``numpytfmr export``: a trained GPT as a Hugging Face folder.

    numpytfmr export --checkpoint runs/pretrain -o hf/my-gpt
    python -c "from transformers import AutoModelForCausalLM as M, AutoTokenizer as T; \\
        M.from_pretrained('hf/my-gpt'); T.from_pretrained('hf/my-gpt')"

The folder holds config.json and model.safetensors (``run.hf.save_hf_checkpoint``: the same
logits in ``AutoModelForCausalLM``) and the tokenizer: GPT-2's vocab.json and merges.txt
with tokenizer_config.json for byte-level BPE and bytes (``AutoTokenizer`` then gives the
same ids), tokenizer.json for the character and word tokenizers of the tasks. The
character tokenizer of ``pretrain --tokenizer char`` has no transformers form: the model
is written without it, and the command says so.
"""
import warnings

from numpytfmr.run.cli import UsageError, checkpoint_path, from_flag, output_dir
from numpytfmr.run.options import add_force, command_parser
from numpytfmr.run.outputs import refuse_overwrite


def add_command(sub):
    p = command_parser(sub, "export")
    p.add_argument("--checkpoint", required=True, type=checkpoint_path, metavar="RUN",
                   help="the run folder (or its checkpoint.json)")
    p.add_argument("-o", "--output", required=True, type=output_dir, metavar="DIR",
                   help="the folder to write (new or empty, unless --force)")
    p.add_argument("--dtype", choices=("float32", "float64"), default=None,
                   help="dtype of the weights written (default: the run's)")
    add_force(p, "replace --output and everything in it")
    p.set_defaults(func=cmd_export)


def cmd_export(args):
    import numpy as np

    from numpytfmr.run.checkpoint import load_run
    from numpytfmr.run.hf import save_hf_checkpoint
    if args.output == "none":
        raise UsageError("--output none: export writes a folder; name one")
    refuse_overwrite("--output", args.output, args.force, folder=True,
                     instead=", or name another folder")
    params, config, tokenizer = from_flag("--checkpoint", load_run, args.checkpoint)
    dtype = None if args.dtype is None else np.dtype(args.dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")           # the notes below say it in one line each
        try:
            info = save_hf_checkpoint(params, config, args.output, tokenizer=tokenizer,
                                      dtype=dtype, force=args.force)
        except ValueError as exc:
            raise UsageError(f"--checkpoint {args.checkpoint}: {exc}") from None
    print(f"{info['directory']}: {info['architecture']} ({info['model_type']}, "
          f"{info['tensors']} tensors, {info['dtype']}), tokenizer "
          f"{info['tokenizer'] or 'not written'}: {', '.join(info['files'])}")
    for note in info["notes"]:
        print(f"note: {note}")
    print(f"load it: AutoModelForCausalLM.from_pretrained({info['directory']!r}), "
          f"AutoTokenizer.from_pretrained({info['directory']!r})")
    return 0
