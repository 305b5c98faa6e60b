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
from registry.errors import RegistryError
from whip.app import create_app
from whip.cli_client import add_client_commands, run_client
from whip.config import Config, ConfigError, is_loopback, load_config
from whip.eventloop import new_event_loop
from whip.rtc.compat import IncompatibleAiortcError
from whip.rtc.host_addresses import local_addresses, restrict_host_addresses
from whip.rtc.ice_tcp import IceTcpBindError
from whip.rtc.udp_mux import UdpPortInUseError

logger = logging.getLogger(__name__)

EXIT_CANNOT_START = 2
"""Exit status of a refused configuration (or an aiortc stack the adapter does not know)."""
EXIT_PORT_IN_USE = 3
"""Exit status when the ICE UDP or TCP port cannot be bound (another process holds it)."""


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
    serve.add_argument(
        "--video-codec",
        action="append",
        default=None,
        help="video format to accept, most preferred first (repeatable; replaces "
        "pipeline.video_codecs)",
    )
    serve.add_argument(
        "--tcp-port",
        type=int,
        default=None,
        help="the one ICE-TCP port of every session (0: a free port, -1: off)",
    )
    serve.add_argument(
        "--udp-port", type=int, default=None, help="the one UDP port of every session's ICE"
    )
    serve.add_argument(
        "--udp-mux",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="share one UDP port among all sessions (--no-udp-mux: a socket per session)",
    )
    serve.add_argument("--jwks-url", default=None, help="JWKS of JWT bearer tokens (auth.jwks_url)")
    serve.add_argument(
        "--jwks-file", default=None, help="JWKS file of JWT bearer tokens (auth.jwks_file)"
    )
    serve.add_argument("--auth-hook-url", default=None, help="HTTP auth hook (auth.hook_url)")
    serve.add_argument(
        "--store", default=None, help="cluster mode: the PostgreSQL URL of the cluster store"
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
        "pipeline.video_codecs": tuple(args.video_codec) if args.video_codec else None,
        "ice.tcp_port": args.tcp_port,
        "ice.udp_port": args.udp_port,
        "ice.udp_mux": args.udp_mux,
        "auth.jwks_url": args.jwks_url,
        "auth.jwks_file": args.jwks_file,
        "auth.hook_url": args.auth_hook_url,
        "cluster.store": args.store,
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
        return EXIT_CANNOT_START
    if config.anonymous:
        logger.warning(
            "no principals configured: anonymous mode (loopback only); every "
            "caller is principal 'anonymous' with operator rights"
        )
    configure_ice(config)
    host, port = config.server.host, config.server.port
    loop = new_event_loop(config.server.event_loop)
    ice = config.ice
    logger.info(
        "serving on http://%s:%d (ICE UDP %s, data dir %s, %s loop)",
        host,
        port,
        (f"port {ice.udp_port} shared" if ice.udp_port else "one shared free port")
        if ice.udp_mux
        else "a socket per session",
        config.server.data_dir,
        type(loop).__module__.partition(".")[0],  # what runs, not only what was asked
    )
    try:
        # A burst of encoders reconnecting must not overflow the default accept queue (128).
        web.run_app(app, host=host, port=port, print=None, backlog=1024, loop=loop)
    except UdpPortInUseError as exc:
        logger.error("cannot start: %s (ice.udp_port; 0 picks a free port)", exc.strerror)
        return EXIT_PORT_IN_USE
    except IceTcpBindError as exc:
        logger.error("cannot start: %s (ice.tcp_port; 0 picks a free port, -1 turns it off)", exc)
        return EXIT_PORT_IN_USE
    except RegistryError as exc:  # cluster mode: a store schema newer than this node's
        logger.error("cannot start: %s", exc)
        return EXIT_CANNOT_START
    except OSError as exc:
        if not config.cluster.enabled:
            raise
        logger.error("cannot start: the cluster store is out of reach: %s", exc)
        return EXIT_CANNOT_START
    return 0
