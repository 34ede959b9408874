"""The report channel: one line per record, `<json>\\t<mac>`, appended to a file the grader
reads after the run.

A runner session claims one key from the grader's key directory (rename, then read and delete:
two processes never get the same key, and nothing is left to read afterwards) and MACs every
record with it. The key exists nowhere else in the sandbox, so lines printed, planted or edited
by the code under test fail verification. Records carry the key's number (`s`) and a sequence
number (`n`).

Everything the writer needs is bound at import (before any code under test runs): a later
`json.dumps = ...` or `hashlib.sha256 = ...` does not reach it.
"""

import hashlib
import os

from . import ENV_CHANNEL, ENV_KEYS, ENV_WORKDIR, KEY_COUNT

_sha256 = hashlib.sha256
_write = os.write
_open = os.open
_close = os.close
_APPEND = os.O_WRONLY | os.O_APPEND | os.O_CREAT
_BLOCK = 64  # SHA-256's block size, for the HMAC


def mac(key, message):
    """HMAC-SHA256 of `message` (bytes) under `key` (bytes), hex; built on the bound sha256."""
    if len(key) > _BLOCK:
        key = _sha256(key).digest()
    key = key + b"\0" * (_BLOCK - len(key))
    inner = _sha256(bytes(b ^ 0x36 for b in key) + message).digest()
    return _sha256(bytes(b ^ 0x5C for b in key) + inner).hexdigest()


def _quote(text):
    out = ['"']
    for char in text:
        if char == '"' or char == "\\":
            out.append("\\" + char)
        elif char < " " or char == "\x7f":
            out.append("\\u%04x" % ord(char))
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def encode(value):
    """JSON text for str, int, bool, None, float and lists/tuples/dicts of them."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return "%d" % value
    if isinstance(value, float):
        return repr(value) if value == value and value not in (float("inf"), -float("inf")) else "null"
    if isinstance(value, str):
        return _quote(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(encode(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(_quote(str(k)) + ":" + encode(v) for k, v in value.items()) + "}"
    return _quote(repr(value))


def _claim_key(directory):
    """(number, key) of the lowest unclaimed key in `directory`, or None when all are taken."""
    for number in range(KEY_COUNT):
        source = os.path.join(directory, str(number))
        claimed = "%s.%d" % (source, os.getpid())
        try:
            os.rename(source, claimed)
        except OSError:
            continue
        try:
            with open(claimed, "rb") as handle:
                key = handle.read().strip()
        finally:
            try:
                os.unlink(claimed)
            except OSError:
                pass
        if key:
            return number, key
    return None


class Channel(object):
    """A claimed session's writer. `record(kind, **fields)` appends one MAC'd line."""

    __slots__ = ("session", "workdir", "_key", "_fd", "_seq")

    def __init__(self, session, key, fd, workdir):
        self.session = session
        self.workdir = workdir
        self._key = key
        self._fd = fd
        self._seq = 0

    def record(self, kind, **fields):
        if self._fd is None:
            return
        fields["k"] = kind
        fields["s"] = self.session
        fields["n"] = self._seq
        self._seq += 1
        body = encode(fields).encode("utf-8", "surrogateescape")
        _write(self._fd, body + b"\t" + mac(self._key, body).encode("ascii") + b"\n")

    def close(self):
        fd, self._fd = self._fd, None
        if fd is not None:
            _close(fd)


def open_channel(environ=None):
    """Claim a key and open the report file; None when this process is not a grader's runner
    (no variables) or every key is taken. Removes the grader's variables from `environ`, so
    the code under test and the processes it starts do not find them."""
    environ = os.environ if environ is None else environ
    keys = environ.pop(ENV_KEYS, None)
    path = environ.pop(ENV_CHANNEL, None)
    workdir = environ.pop(ENV_WORKDIR, None)
    if not keys or not path or not workdir:
        return None
    claimed = _claim_key(keys)
    if claimed is None:
        return None
    session, key = claimed
    fd = _open(path, _APPEND, 0o600)
    return Channel(session, key, fd, os.path.realpath(workdir))
