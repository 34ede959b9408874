"""Files the runner loaded, as the grader checks them: a path relative to the work tree (or
absolute, outside it) and the git blob id of the bytes read, comparable to `git hash-object`."""

import hashlib
import os

_sha1 = hashlib.sha1


def blob_id(data):
    return _sha1(b"blob %d\0" % len(data) + data).hexdigest()


def inside(path, workdir):
    """Whether `path` (any form) lies in the work tree, symlinks resolved."""
    real = os.path.realpath(path)
    return real == workdir or real.startswith(workdir + os.sep)


def describe(path, workdir):
    """[path relative to the work tree or absolute, blob id or None] for `path`."""
    path = os.fspath(path) if hasattr(os, "fspath") else str(path)
    absolute = os.path.abspath(path)
    if not inside(absolute, workdir):
        return [absolute, None]
    real = os.path.realpath(absolute)
    relative = os.path.relpath(real, workdir).replace(os.sep, "/")
    try:
        with open(real, "rb") as handle:
            return [relative, blob_id(handle.read())]
    except (IOError, OSError):
        return [relative, None]


def source_file(obj):
    """The file that defines a plugin: a module's own, or the module of an object's class."""
    module_file = getattr(obj, "__file__", None)
    if isinstance(module_file, str):
        return module_file
    import sys

    owner = obj if isinstance(obj, type) else type(obj)
    module = sys.modules.get(getattr(owner, "__module__", None) or "")
    module_file = getattr(module, "__file__", None)
    return module_file if isinstance(module_file, str) else None


def writable(path):
    """Whether a sandbox user could write `path` or its directory (an error counts as yes)."""
    try:
        return os.access(path, os.W_OK) or os.access(os.path.dirname(path), os.W_OK)
    except (OSError, ValueError):
        return True


def defined_in(value, real):
    """Whether `value` is a function or class whose code is in the file `real`."""
    target = value.__dict__.values() if isinstance(value, type) else (value,)
    for item in target:
        item = getattr(item, "__func__", item)
        code = getattr(item, "__code__", None) if isinstance(item, type(writable)) else None
        if code is not None and os.path.realpath(code.co_filename or "") == real:
            return True
    return False
