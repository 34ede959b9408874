"""Calls to a vLLM server other than sampling: the admission probe (its logprobs mode, how it
sends the sampled ids back) and weight-version labels (vLLM 0.33; facts in docs/design.md,
"vLLM 0.33 as read")."""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from typing import Literal

import httpx

from ._vllm_wire import (
    NEUTRAL_PENALTIES,
    TOKEN_ID_PATTERN,
    RetryElsewhere,
    error_for,
    error_message,
)
from .base import EngineError

log = logging.getLogger(__name__)

#: `request_id` prefix of the logprobs-mode probe (vLLM takes the body's `request_id`).
PROBE_REQUEST_ID = "harness-gym-logprobs-probe"


class VLLMConfigError(EngineError):
    """A vLLM server runs with settings that would make the traces wrong (e.g. raw logprobs)."""


#: What `verify_logprobs` does with a server that does not report processed logprobs:
#: "warn" (the default) logs a warning and records the mode in `VLLMEngine.logprobs_mode`,
#: "strict" keeps the server out of service (`VLLMConfigError` at start), "off" says nothing.
VerifyLogprobs = Literal["warn", "strict", "off"]
VERIFY_LOGPROBS: tuple[VerifyLogprobs, ...] = ("warn", "strict", "off")


@dataclass(frozen=True)
class ServerCapabilities:
    """What the admission probe found out about one server."""

    #: "processed_logprobs", "raw_logprobs" or "unknown".
    logprobs_mode: str
    #: Whether it honours `return_tokens_as_token_ids` (logprobs tokens read "token_id:N").
    #: vLLM does; a server that does not is read with `ids_from="echo"`.
    token_ids_in_logprobs: bool
    #: The first few logprobs tokens it sent, for the log line that says why.
    sample_tokens: tuple[str, ...] = ()


def probe_server(url: str, model: str, prompt: list[int], timeout: httpx.Timeout
                 ) -> ServerCapabilities:
    """Ask `url` for a short `top_k=1` completion and read its capabilities off the answer.

    Under processed logprobs the one token `top_k=1` leaves has logprob 0.0 exactly; raw
    logprobs (vLLM's default) report its T=1 log-probability, below 0. The probe also asks for
    `return_tokens_as_token_ids`, so its tokens say whether the server honours that flag.
    Raises `RetryElsewhere` when the server could not answer, `VLLMConfigError` when it
    refused or answered without logprobs."""
    body = {
        "model": model, "prompt": prompt, "max_tokens": 4, "temperature": 1.0, "top_p": 1.0,
        "top_k": 1, **NEUTRAL_PENALTIES, "logprobs": 0, "return_tokens_as_token_ids": True,
        "request_id": f"{PROBE_REQUEST_ID}-{uuid.uuid4().hex}",
    }
    response = httpx.post(f"{url}/v1/completions", json=body, timeout=timeout)
    if response.status_code >= 500:
        raise RetryElsewhere(f"the logprobs probe got HTTP {response.status_code}")
    if response.status_code == 404 and "does not exist" in response.text:
        raise VLLMConfigError(
            f"vLLM at {url} does not serve the model {model!r}; it serves "
            f"{_served_models(url, timeout)}: pass that as model= (or leave model= out)")
    if response.status_code != 200:
        error = error_for(response.status_code, response.text, url, len(prompt))
        raise VLLMConfigError(f"vLLM at {url} refused the logprobs probe: {error}")
    try:
        logprobs = response.json()["choices"][0]["logprobs"]
        values = [float(v) for v in logprobs["token_logprobs"]]
        tokens = [str(t) for t in logprobs.get("tokens") or ()]
    except (ValueError, KeyError, IndexError, TypeError) as exc:
        raise VLLMConfigError(f"vLLM at {url} answered the logprobs probe without the "
                              f"sampled tokens' logprobs: {response.text[:300]}") from exc
    if values and all(v == 0.0 for v in values):
        mode = "processed_logprobs"
    elif values and all(v < 0 for v in values):
        mode = "raw_logprobs"
    else:
        mode = "unknown"
    as_ids = bool(tokens) and len(tokens) == len(values) and all(
        TOKEN_ID_PATTERN.fullmatch(t) for t in tokens)
    return ServerCapabilities(mode, as_ids, tuple(tokens[:3]))


def _served_models(url: str, timeout: httpx.Timeout) -> list[str]:
    try:
        return [m["id"] for m in httpx.get(f"{url}/v1/models", timeout=timeout).json()["data"]]
    except (httpx.HTTPError, ValueError, KeyError, TypeError):
        return ["(GET /v1/models failed)"]


def check_processed(url: str, mode: str, verify: VerifyLogprobs) -> None:
    """Apply `verify` to a server whose probe found `mode`: raise under "strict", warn under
    "warn" (p_old is then not the probability each token was drawn with)."""
    if mode == "processed_logprobs" or verify == "off":
        return
    problem = (
        f"vLLM at {url} does not report processed logprobs (a top_k=1 sample, whose "
        f"processed logprob is exactly 0.0, says {mode}), so p_old would not be the "
        "probability each token was drawn with. Restart it with `--logprobs-mode "
        "processed_logprobs` (as `trl vllm-serve` does)"
    )
    if verify == "strict":
        raise VLLMConfigError(problem + ", or pass verify_logprobs='warn' "
                              "('vllm:URL?verify_logprobs=warn') to accept its logprobs.")
    log.warning("%s. Its logprobs are recorded as sent (verify_logprobs=strict refuses such "
                "a server, verify_logprobs=off silences this).", problem)


def label_weights(urls: list[str], version: int, timeout: httpx.Timeout) -> None:
    """`POST /update_weight_version` on every server (dev mode)."""
    with httpx.Client(timeout=timeout) as client:
        answers = [_post_label(client, url, version) for url in urls]
    _check_labels(urls, answers)


async def alabel_weights(client: httpx.AsyncClient, urls: list[str], version: int) -> None:
    """`label_weights` on an event loop."""
    answers = await asyncio.gather(*(_apost_label(client, url, version) for url in urls))
    _check_labels(urls, list(answers))


def _label_body(version: int) -> dict[str, str]:
    # vLLM declares `new_version: str` (pydantic does not coerce an int): send a string.
    return {"new_version": str(int(version))}


def _post_label(client: httpx.Client, url: str, version: int) -> httpx.Response | Exception:
    try:
        return client.post(f"{url}/update_weight_version", json=_label_body(version))
    except httpx.TransportError as exc:
        return exc


async def _apost_label(
    client: httpx.AsyncClient, url: str, version: int
) -> httpx.Response | Exception:
    try:
        return await client.post(f"{url}/update_weight_version", json=_label_body(version))
    except httpx.TransportError as exc:
        return exc


def _check_labels(urls: list[str], answers: list[httpx.Response | Exception]) -> None:
    refused = []
    for url, answer in zip(urls, answers):
        if isinstance(answer, Exception):
            log.warning("could not label the weight version on %s: %r", url, answer)
        elif answer.status_code == 404:
            refused.append(f"{url} has no /update_weight_version: start vLLM with "
                           "VLLM_SERVER_DEV_MODE=1")
        elif answer.status_code != 200:
            refused.append(f"{url} answered HTTP {answer.status_code}: "
                           f"{error_message(answer.text)[0]}")
    if refused:
        raise VLLMConfigError("could not label the weight version: " + "; ".join(refused))
