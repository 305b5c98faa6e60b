"""``whip-ingest`` command line (also ``python -m whip``)."""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from aiohttp import web

from whip.app import ServerSettings, create_app

logger = logging.getLogger(__name__)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="whip-ingest", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the ingest server")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument("--data-dir", type=Path, default=Path("./data"))
    serve.add_argument("--log-level", default="INFO")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script."""
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if args.command == "serve":
        app = create_app(ServerSettings(data_dir=args.data_dir))
        logger.info("serving on http://%s:%d (data dir %s)", args.host, args.port, args.data_dir)
        web.run_app(app, host=args.host, port=args.port, print=None)
        return 0
    return 2
