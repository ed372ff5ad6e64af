"""``numpytfmr docs [-o DIR]``: build the reader, an offline HTML site with each equation of
the notes beside the code that computes it (docs/reader.md). The builder is ``numpytfmr.site``.
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

