"""``numpytfmr docs [-o DIR]``: build the reader, an offline HTML site with each equation of
the notes beside the code that computes it.

    numpytfmr docs -o site && python -m webbrowser site/index.html

The site needs no network, neither to build nor to view (the math is MathML, drawn by the
browser). It is built from the code (the topic modules, the registry of ops, the contracts)
and from the checkout around it (docs/contract.md, docs/errata.toml, docs/modules.toml,
notebooks/, tests/), found next to the package or in the current directory, or given with
``--source``. The notebooks are executed (nbclient) so that their pages show outputs and
figures. The builder lives in ``numpytfmr.site``; its libraries are the ``docs`` extra.
"""
import os
import sys

from numpytfmr.run.options import add_force, command_parser


def add_command(sub):
    p = command_parser(sub, "docs")
    p.add_argument("-o", "--output", default="site", metavar="DIR",
                   help="the folder to write the site into (default: site); an existing folder "
                        "must be empty or hold an earlier site")
    add_force(p, "write into DIR even though it holds other files (they are left alone)")
    p.add_argument("--no-execute", dest="execute", action="store_false",
                   help="do not run the notebooks (their pages then show code without outputs); "
                        "by default they run once, when nbclient is installed, and their outputs "
                        "are cached until a notebook or the package changes")
    p.add_argument("--source", metavar="DIR",
                   help="the checkout holding README.md, docs/, notebooks/ and tests/ (default: "
                        "the folder above the package, else the current directory)")
    p.set_defaults(func=cmd_docs)


def cmd_docs(args):
    try:
        from numpytfmr.site import SiteExistsError, build_site
    except ImportError as exc:
        print(f"numpytfmr docs: error: {exc.name or exc} is not installed; the reader needs the "
              "docs extra: pip install \"numpytfmr[docs]\"", file=sys.stderr)
        return 2

    if args.source is not None and not os.path.isfile(os.path.join(args.source, "README.md")):
        print(f"numpytfmr docs: error: --source is {args.source!r}, which holds no README.md; "
              "expected the numpytfmr checkout", file=sys.stderr)
        return 2
    try:
        result = build_site(args.output, force=args.force, source=args.source,
                            execute=None if args.execute else False)
    except SiteExistsError as exc:
        print(f"numpytfmr docs: error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {len(result.pages)} pages ({result.n_bytes / 1e6:.1f} MB) to {result.out_dir} "
          f"in {result.seconds:.1f} s")
    print(f"open {result.index} in a browser (python -m webbrowser {result.index})")
    return 0


if __name__ == "__main__":                      # python -m numpytfmr.run.commands.docs [-o DIR]
    import argparse

    parser = argparse.ArgumentParser(prog="numpytfmr", allow_abbrev=False)
    add_command(parser.add_subparsers(dest="command", required=True))
    parsed = parser.parse_args(["docs", *sys.argv[1:]])
    sys.exit(parsed.func(parsed))
