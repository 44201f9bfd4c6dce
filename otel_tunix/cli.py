"""The ``otel-tunix`` command: ``otel-tunix demo [...]``."""

from __future__ import annotations

import sys

_USAGE = """usage: otel-tunix COMMAND [options]

commands:
  demo      train a small instrumented PyTorch model on the CPU and show the breakdown

Run 'otel-tunix COMMAND --help' for a command's options.
"""


def main(argv: list[str] | None = None) -> int:
    """Dispatch to a subcommand; imports stay lazy so ``--help`` is instant."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(_USAGE, end="")
        return 0 if args else 2
    command, rest = args[0], args[1:]
    if command == "demo":
        from otel_tunix.demo import main as demo_main

        return demo_main(rest)
    print(f"otel-tunix: unknown command {command!r}\n\n{_USAGE}", end="", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
