"""What runs the reference: the ``numpytfmr`` command and the code behind it.

Nothing here is an equation of the notes; the topic modules one level up never import it.

    cli.py, commands/   the command line (``numpytfmr check``, ``train``, ``generate``, ...)
    loop.py             TrainSettings, the training loop (one flat loop, the fast or the
                        reference update), what wraps it (progress, a time budget), the
                        random stream of a step
    checkpoint.py       the checkpoint format: save, load, rebuild a model, resume a run
    models.py           the model families the commands train: default configs, seq2seq table
    tasks.py            training and evaluating a GPT on a character task, a seq2seq model on
                        the toy translation, greedy completion and translation
    data.py             tokenizers, the synthetic tasks, batching, evaluation
    bpe.py              byte-level BPE: train_bpe, BPETokenizer (GPT-2 files too)
    batches.py          get_batch (random windows of a token stream) and token files
    corpus.py           the default offline corpus of ``pretrain`` (stdlib docstrings)
    pretrain.py         the pretraining harness: text tokenizers, bits per byte, n-gram baselines
    hf.py               GPT-2 and LLaMA weights from and to local safetensors files
    bench.py            speed and memory measurements (``numpytfmr bench``), one timing harness
    blas.py             the number of threads of NumPy's BLAS
    examples.py         the notes' worked examples recomputed (``numpytfmr examples``)
    progress.py         the progress bar

Files are written atomically by ``numpytfmr/shared/fileio.py``, which the grader uses too.
"""
