"""``whip-ingest`` command line (also ``python -m whip``)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from aiohttp import web

from pipeline.errors import PipelineError
from pipeline.processor import load_processor
from whip.app import create_app
from whip.cli_client import add_client_commands, run_client
from whip.config import Config, ConfigError, is_loopback, load_config
from whip.eventloop import new_event_loop
from whip.rtc.compat import IncompatibleAiortcError
from whip.rtc.host_addresses import local_addresses, restrict_host_addresses

logger = logging.getLogger(__name__)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="whip-ingest", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="run the ingest server")
    serve.add_argument("--config", type=Path, default=None, help="TOML config file")
    serve.add_argument("--host", default=None)
    serve.add_argument("--port", type=int, default=None)
    serve.add_argument("--data-dir", type=Path, default=None)
    serve.add_argument("--max-sessions", type=int, default=None)
    serve.add_argument("--stream-limit", type=int, default=None)
    serve.add_argument(
        "--public-host",
        action="append",
        default=None,
        help="address to advertise as ICE host candidate (repeatable)",
    )
    serve.add_argument("--log-level", default=os.environ.get("WHIP_INGEST_LOG_LEVEL", "INFO"))
    add_client_commands(sub)
    return parser


def configure_ice(config: Config) -> None:
    """Choose the addresses ICE gathers host candidates on (process-wide).

    Public hosts that belong to this machine (127.0.0.1 on a loopback-only machine, an
    interface address) are gathered on directly; the others (a NAT's 1:1 public IP) are
    added to each answer next to the gathered candidates, with the same port
    (:func:`whip.sdp.finalize_answer`). Bound to loopback with no public host, the server
    gathers on loopback only (aioice skips loopback by default).
    """
    local = local_addresses()
    bindable = [h for h in config.server.public_hosts if h in local]
    if bindable:
        restrict_host_addresses(bindable)
    elif not config.server.public_hosts and is_loopback(config.server.host):
        restrict_host_addresses(["::1"] if ":" in config.server.host else ["127.0.0.1"])


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script."""
    args = _parser().parse_args(argv)
    if args.command != "serve":
        return run_client(args)
    logging.basicConfig(
        level=args.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    overrides = {
        "server.host": args.host,
        "server.port": args.port,
        "server.data_dir": args.data_dir,
        "limits.max_sessions": args.max_sessions,
        "limits.stream_limit": args.stream_limit,
        "server.public_hosts": tuple(args.public_host) if args.public_host else None,
    }
    config_path = args.config or (
        Path(os.environ["WHIP_INGEST_CONFIG"]) if "WHIP_INGEST_CONFIG" in os.environ else None
    )
    try:
        config = load_config(config_path, os.environ, overrides)
        for spec in config.pipeline.processors:
            load_processor(spec)  # a bad spec fails here, not in the first session
        app = create_app(config)  # checks the aiortc adapter's internals
    except (ConfigError, IncompatibleAiortcError, PipelineError) as exc:
        logger.error("cannot start: %s", exc)
        return 2
    if not config.principals:
        logger.warning(
            "no principals configured: anonymous mode (loopback only); every "
            "caller is principal 'anonymous' with operator rights"
        )
    configure_ice(config)
    host, port = config.server.host, config.server.port
    loop = new_event_loop(config.server.event_loop)
    logger.info(
        "serving on http://%s:%d (data dir %s, %s loop)",
        host,
        port,
        config.server.data_dir,
        type(loop).__module__.partition(".")[0],  # what runs, not only what was asked
    )
    # A burst of encoders reconnecting must not overflow the default accept queue (128).
    web.run_app(app, host=host, port=port, print=None, backlog=1024, loop=loop)
    return 0
