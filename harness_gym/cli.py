"""The `harness-gym` command line."""

from __future__ import annotations

import argparse
import signal
import sys
import threading


def _serve(args: argparse.Namespace) -> int:
    from .proxy import InterceptionProxy

    proxy = InterceptionProxy(
        args.engine, host=args.host, port=args.port, admin_key=args.admin_key
    ).start()
    print(f"harness-gym proxy serving {proxy.engine.model_name} at {proxy.url}", flush=True)
    print(f"  OpenAI base URL: {proxy.base_url}   new session: POST {proxy.url}/sessions", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    proxy.stop()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="harness-gym",
        description="Run coding-agent CLIs as RL environments, with token-faithful traces.",
    )
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the interception proxy on its own")
    serve.add_argument("--engine", default="tiny", help="engine spec: tiny, smollm2, hf:PATH, ...")
    serve.add_argument("--host", default="127.0.0.1", help="bind address (default: loopback only)")
    serve.add_argument("--port", type=int, default=0, help="port (default: any free port)")
    serve.add_argument("--admin-key", default=None, help="key required by /sessions routes")
    serve.set_defaults(handler=_serve)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
