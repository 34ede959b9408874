"""Every SDK call the `e2b` and `hf` backends make, checked against the installed SDKs.

The backends' tests run over fakes of the SDKs (tests/support/fake_e2b.py, fake_hf_sandbox.py),
which can only be as right as our reading of the SDKs. Here the backends run a session over the
fakes (create; commands that succeed, fail, time out, take stdin; background jobs waited,
killed, their stream dropped and reconnected; files written, read and missing; a machine that
died; a refused stop retried; close), with every object a fake hands back wrapped in a
`Recorder`. Each member the backend touches is checked, as it is used, against the real SDK
class the fake stands for, found through the real SDK's own annotations:

- the member exists on the real class (method, property, annotated field, or set in `__init__`);
- the call's arguments bind to the real signature (keywords under `**opts: Unpack[ApiParams]`
  must be keys of that TypedDict);
- what comes back has the type the real signature declares (the overload whose `Literal`
  parameters match the call), or is a fake of that class's name, which is then checked the same
  way;
- what is raised is one of the real SDK's exception classes.

Beside that: the `issubclass` relations the backends' `except` clauses rely on, and a scan of
e2b.py and hf.py for SDK members the session never used (a new SDK call needs a session step
here). An SDK upgrade that renames, retypes or re-parents any of these fails this file.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import inspect
import re
import subprocess
import sys
import time
import types
import typing
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from remote_conformance import QUICK_STOPS

e2b = pytest.importorskip("e2b", reason="the e2b SDK is not installed")
hub = pytest.importorskip("huggingface_hub", reason="huggingface_hub is not installed")
if not hasattr(hub, "Sandbox"):
    pytest.skip("huggingface_hub has no Sandbox (needs >= 2.4)", allow_module_level=True)

from e2b.sandbox_sync.commands.command_handle import CommandHandle as RealCommandHandle
from huggingface_hub import errors as hub_errors
from support import fake_e2b, fake_hf_sandbox

import harness_gym.sandbox.e2b as e2b_backend
import harness_gym.sandbox.hf as hf_backend
from harness_gym.sandbox import SandboxError, SandboxSpec

FAKE_MODULES = (fake_e2b.__name__, fake_hf_sandbox.__name__)
SDK_PACKAGES = ("e2b", "huggingface_hub")

# `huggingface_hub.Sandbox.kill` is a descriptor (`_KillMethod`) that is a classmethod on the
# class and `_kill` on an instance (its own comment says so); the backend calls the instance one.
INSTANCE_VARIANTS = {(hub.Sandbox, "kill"): "_kill"}
# Builtin exceptions the real SDK raises itself, with the source line that raises them.
SDK_RAISES_BUILTIN = {
    (RealCommandHandle, "wait"): 'raise Exception("Command ended without an end event")',
}


@dataclasses.dataclass
class Use:
    where: str  # "Commands.run"
    args: tuple[Any, ...] | None  # None: an attribute read
    kwargs: dict[str, Any]


class Contract:
    """The uses recorded in one session, and what in them disagrees with the real SDK."""

    def __init__(self) -> None:
        self.uses: list[Use] = []
        self.problems: list[str] = []

    def names(self) -> set[str]:
        return {use.where.rsplit(".", 1)[1] for use in self.uses}


class Recorder:
    """Stands in front of a fake SDK object; checks each member used against `real`."""

    def __init__(self, target: Any, real: type, contract: Contract) -> None:
        object.__setattr__(self, "_target", target)
        object.__setattr__(self, "_real", real)
        object.__setattr__(self, "_contract", contract)

    def __getattr__(self, name: str) -> Any:
        target, real, contract = self._target, self._real, self._contract
        where = f"{real.__name__}.{name}"
        value = getattr(target, name)
        member = real_member(real, name)
        if member is None:
            contract.problems.append(f"{where}: the real {real.__qualname__} has no {name!r}")
            return value
        if not callable(value) or isinstance(value, Recorder):
            contract.uses.append(Use(where, None, {}))
            if is_sdk(type(target)):  # the SDK's own object: its values are the SDK's too
                return value
            return wrap(value, member.type, where, contract)

        def call(*args: Any, **kwargs: Any) -> Any:
            contract.uses.append(Use(where, args, kwargs))
            returns = member.returns(args, kwargs, where, contract)
            try:
                result = value(*args, **kwargs)
            except Exception as exc:
                check_raised(exc, real, name, where, contract)
                raise
            return wrap(result, returns, where, contract)

        return call

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._target, name, value)


@dataclasses.dataclass
class Member:
    owner: type
    function: Any = None  # for a method: the real function
    type: Any = Any  # for a data member: its declared type
    skip_first: bool = True  # self or cls

    def returns(self, args: tuple, kwargs: dict, where: str, contract: Contract) -> Any:
        """The declared return type for this call; a problem if the arguments do not bind."""
        candidates = typing.get_overloads(self.function) or [self.function]
        errors = []
        for function in candidates:
            signature = inspect.signature(function)
            try:
                bound = signature.bind(*((None,) if self.skip_first else ()), *args, **kwargs)
            except TypeError as exc:
                errors.append(str(exc))
                continue
            hints = typing.get_type_hints(function, include_extras=True)
            if not literals_match(bound, hints) or not unpacked_keys_match(bound, hints, errors):
                continue
            return resolve(hints.get("return", Any), self.owner)
        why = "; ".join(dict.fromkeys(errors)) or "a Literal parameter differs"
        call = f"{where}{arguments(args, kwargs)}"
        contract.problems.append(f"{call}: no real signature takes it ({why})")
        return Any


def literals_match(bound: inspect.BoundArguments, hints: dict[str, Any]) -> bool:
    """Whether every argument given for a `Literal` parameter is one of its values."""
    for name, value in bound.arguments.items():
        hint = hints.get(name)
        union = typing.get_origin(hint) in (typing.Union, types.UnionType)
        arms = typing.get_args(hint) if union else (hint,)
        literals = [a for a in arms if typing.get_origin(a) is typing.Literal]
        if not literals:
            continue
        allowed = [v for lit in literals for v in typing.get_args(lit)]
        if not (value in allowed or (value is None and type(None) in arms)):
            return False
    return True


def unpacked_keys_match(bound: inspect.BoundArguments, hints: dict[str, Any], errors: list) -> bool:
    """Keywords caught by `**opts: Unpack[TypedDict]` must be keys of that TypedDict."""
    for name, param in bound.signature.parameters.items():
        hint = hints.get(name)
        if param.kind is not param.VAR_KEYWORD or typing.get_origin(hint) is not typing.Unpack:
            continue
        allowed = typing.get_type_hints(typing.get_args(hint)[0])
        unknown = set(bound.arguments.get(name, {})) - set(allowed)
        if unknown:
            errors.append(f"{sorted(unknown)} are not in {typing.get_args(hint)[0].__name__}")
            return False
    return True


def real_member(real: type, name: str) -> Member | None:
    if (real, name) in INSTANCE_VARIANTS:
        return Member(real, function=getattr(real, INSTANCE_VARIANTS[real, name]))
    static = inspect.getattr_static(real, name, None)
    if isinstance(static, property):
        hints = typing.get_type_hints(static.fget) if static.fget else {}
        return Member(real, type=resolve(hints.get("return", Any), real))
    if isinstance(static, classmethod):
        return Member(real, function=static.__func__)
    if isinstance(static, staticmethod):
        return Member(real, function=static.__func__, skip_first=False)
    if inspect.isfunction(static):
        return Member(real, function=static)
    if inspect.isfunction(getattr(static, "method", None)):  # e2b's `class_method_variant`
        return Member(real, function=static.method)
    hints = typing.get_type_hints(real) if not isinstance(real, types.ModuleType) else {}
    if name in hints:
        return Member(real, type=resolve(hints[name], real))
    return init_attribute(real, name)


def init_attribute(real: type, name: str) -> Member | None:
    """An attribute the real `__init__` sets (`self.files = SandboxFiles(self)`)."""
    try:
        source = inspect.getsource(real.__init__)
    except (OSError, TypeError):
        return None
    found = re.search(rf"self\.{name}\s*(?::[^=]+)?=\s*(\w+)?", source)
    if found is None:
        return None
    made = getattr(sys.modules[real.__module__], found.group(1) or "", None)
    return Member(real, type=made if isinstance(made, type) else Any)


def resolve(hint: Any, owner: type) -> Any:
    return owner if hint is typing.Self else hint


def wrap(value: Any, declared: Any, where: str, contract: Contract) -> Any:
    """`value` checked against the declared type; fakes and SDK objects come back wrapped."""
    if declared is Any or isinstance(value, Recorder):
        return value
    origin = typing.get_origin(declared) or declared
    if origin in (typing.Union, types.UnionType):
        arms = typing.get_args(declared)
        fitting = [a for a in arms if fits(value, a)]
        if not fitting:
            contract.problems.append(f"{where} gave {type(value).__name__}, the SDK: {declared}")
            return value
        return wrap(value, fitting[0], where, contract)
    if origin in (list, typing.List):
        (item,) = typing.get_args(declared) or (Any,)
        if not isinstance(value, list):
            contract.problems.append(f"{where} gave {type(value).__name__}, the SDK: {declared}")
            return value
        return [wrap(v, item, where, contract) for v in value]
    if not fits(value, declared):
        contract.problems.append(f"{where} gave {type(value).__name__}, the SDK: {declared}")
        return value
    if isinstance(origin, type) and (is_fake(type(value)) or is_sdk(type(value))):
        return Recorder(value, origin, contract)
    return value


def fits(value: Any, declared: Any) -> bool:
    if declared is Any:
        return True
    if declared is None or declared is type(None):
        return value is None
    origin = typing.get_origin(declared) or declared
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, a) for a in typing.get_args(declared))
    if origin is typing.Literal:
        return value in typing.get_args(declared)
    if not isinstance(origin, type):
        return True  # a TypeVar or a special form: nothing to hold it to
    if isinstance(value, origin):
        return True
    return is_fake(type(value)) and type(value).__name__ == origin.__name__  # a stand-in


def is_fake(cls: type) -> bool:
    return cls.__module__ in FAKE_MODULES


def is_sdk(cls: type) -> bool:
    return cls.__module__.split(".")[0] in SDK_PACKAGES


def check_raised(exc: Exception, real: type, name: str, where: str, contract: Contract) -> None:
    if is_sdk(type(exc)):
        return
    raises = SDK_RAISES_BUILTIN.get((real, name))
    builtin = type(exc).__module__ == "builtins"
    if raises and builtin and raises in inspect.getsource(getattr(real, name)):
        return
    contract.problems.append(f"{where} raised {type(exc).__qualname__}, which the SDK never does")


def arguments(args: tuple, kwargs: dict) -> str:
    shown = [repr(a)[:40] for a in args] + [f"{k}={v!r}"[:40] for k, v in kwargs.items()]
    return f"({', '.join(shown)})"


SDK_OBJECTS = re.compile(r"(?:\bsdk|_handle|_process|_jobs_api|^api|^result|^process|^listed\[0\])"
                         r"((?:\.\w+)+)")


def sdk_members_named_in(module: types.ModuleType) -> set[str]:
    """Every member name the backend's code reaches through an SDK object."""
    tree = ast.parse(inspect.getsource(module))
    chains = [SDK_OBJECTS.search(ast.unparse(node)) for node in ast.walk(tree)
              if isinstance(node, ast.Attribute)]
    return {name for found in chains if found for name in found.group(1).strip(".").split(".")}


# -- the sessions ----------------------------------------------------------------------------


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    repo = tmp_path / "repo"
    repo.mkdir()
    (repo / "mod.py").write_text("x = 1\n")
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    return repo


def common_session(backend: Any, repo: Path) -> Iterator[Any]:
    """What the env asks of any sandbox, and of one whose machine died; yields the live one
    before its close, so the backend's own step can go in between."""
    box = backend.create(SandboxSpec(repo=repo, env={"SPEC": "1"}))
    assert box.exec("echo hi", env={"PATH": "/usr/bin:/bin"}).stdout == "hi\n"
    assert box.exec("exit 3").exit_code == 3
    assert box.exec("sleep 30", timeout=0.3).timed_out
    assert box.exec(["cat"], stdin=b"in").stdout == "in"
    box.write_file("a.txt", "text")
    assert box.read_file("a.txt") == b"text"
    with pytest.raises(SandboxError):
        box.read_file("missing.txt")
    job = box.start("sleep 0.2; exit 2", stdout_path="logs/j.out")
    assert job.poll() is None
    assert job.wait(timeout=20).exit_code == 2
    assert box.start("sleep 30").wait(timeout=0.3).timed_out
    yield box
    box.close()
    dead = backend.create(SandboxSpec())
    dead.sdk._target.end()
    with pytest.raises(SandboxError):
        dead.exec("true")
    with pytest.raises(SandboxError):
        dead.start("true")
    dead.close()
    backend.close()


def test_every_e2b_sdk_call_matches_the_installed_sdk(repo, monkeypatch) -> None:
    contract = Contract()
    monkeypatch.setattr(fake_e2b.Sandbox, "kill_failures", 1)  # one refused kill, retried
    sdk = Recorder(fake_e2b.Sandbox, e2b.Sandbox, contract)
    backend = e2b_backend.E2BSandboxBackend(
        sandbox_factory=sdk.create, api_key="e2b_test", stop_delays_s=QUICK_STOPS
    )
    for box in common_session(backend, repo):
        job = box.start("sleep 0.5; exit 5")
        time.sleep(0.1)
        for handle in box.sdk._target.open_handles:  # the stream drops; the VM lives
            handle.broken = Exception("Command ended without an end event")
        assert job.wait(timeout=20).exit_code == 5
        box.sdk.commands._target.next_run_error = fake_e2b.rpc_error(
            fake_e2b.Code.CANCELED, "cancelled"
        )
        with pytest.raises(SandboxError):
            box.exec("true", timeout=30)
    assert not contract.problems, "\n".join(dict.fromkeys(contract.problems))
    missing = sdk_members_named_in(e2b_backend) - contract.names()
    assert missing == set(), f"e2b.py uses SDK members no session step exercises: {missing}"


def test_every_hf_sdk_call_matches_the_installed_sdk(repo, monkeypatch) -> None:
    contract = Contract()
    monkeypatch.setattr(fake_hf_sandbox.Sandbox, "cancel_failures", 1)  # kill() only logs
    sdk = Recorder(fake_hf_sandbox.Sandbox, hub.Sandbox, contract)
    jobs = Recorder(fake_hf_sandbox.HfApi(), hub.HfApi, contract)
    backend = hf_backend.HFSandboxBackend(
        sandbox_factory=sdk.create, jobs_api=jobs, token="hf_test", stop_delays_s=QUICK_STOPS
    )
    for box in common_session(backend, repo):
        assert box.exec("kill -9 $PPID").exit_code == -9  # the wrapper shell itself: `signal`
        job = box.start("sleep 30")
        job.kill()
        assert job.poll() is not None
    assert not contract.problems, "\n".join(dict.fromkeys(contract.problems))
    missing = sdk_members_named_in(hf_backend) - contract.names() - set(HF_UNEXERCISED)
    assert missing == set(), f"hf.py uses SDK members no session step exercises: {missing}"


# Members hf.py reads that the session cannot reach with this SDK; each is checked to exist.
HF_UNEXERCISED = {
    "pid": "SandboxProcess.pid, compared only for a sandbox server that predates process ids",
}


def test_the_members_no_session_reaches_exist_in_the_installed_sdk() -> None:
    from huggingface_hub._sandbox import SandboxProcess

    assert "pid" in {f.name for f in dataclasses.fields(SandboxProcess)}


# -- what the backends import and what their except clauses rely on ------------------------


@pytest.mark.parametrize("backend", [e2b_backend, hf_backend], ids=["e2b", "hf"])
def test_every_name_a_backend_imports_from_its_sdk_exists(backend: types.ModuleType) -> None:
    tree = ast.parse(inspect.getsource(backend))
    imported = [(node.module, alias.name) for node in ast.walk(tree)
                if isinstance(node, ast.ImportFrom) and node.module
                and node.module.split(".")[0] in SDK_PACKAGES for alias in node.names]
    assert imported, "the scan found no SDK import"
    for module, name in imported:
        assert hasattr(importlib.import_module(module), name), f"{module}.{name}"



@pytest.mark.parametrize(
    ("sub", "base", "why"),
    [
        (e2b.SandboxNotRunningException, e2b.TimeoutException, "caught before TimeoutException"),
        (e2b.SandboxUnreachableException, e2b.TimeoutException, "caught before TimeoutException"),
        (e2b.TimeoutException, e2b.SandboxException, "a job's kill suppresses SandboxException"),
        (e2b.CommandExitException, e2b.SandboxException, "a non-zero exit is a result"),
        (hub_errors.SandboxCommandError, hub_errors.SandboxError, "all a sandbox call raises"),
    ],
)
def test_the_sdk_exception_classes_relate_as_the_backends_expect(sub, base, why) -> None:
    assert issubclass(sub, base), why


def test_an_authentication_failure_is_no_sandbox_exception_in_e2b() -> None:
    # _create_error tells a refused key apart before the generic SandboxException branch.
    assert not issubclass(e2b.AuthenticationException, e2b.SandboxException)
    assert not issubclass(hub_errors.HfHubHTTPError, hub_errors.SandboxError)


def test_the_terminal_job_stages_are_the_sdks() -> None:
    from huggingface_hub import _sandbox

    assert set(hf_backend.TERMINAL_STAGES) == set(_sandbox._TERMINAL_STAGES)


def test_the_fakes_map_errors_with_the_sdks_own_functions() -> None:
    box = fake_e2b.Sandbox.create(template="base", timeout=60)
    try:
        assert type(fake_e2b.vm_gone(box)) is e2b.SandboxNotRunningException
        assert type(fake_e2b.stream_broken(box, vm_alive=True)) is e2b.SandboxUnreachableException
        assert type(fake_e2b.stream_broken(box, vm_alive=False)) is e2b.SandboxNotRunningException
        deadline = fake_e2b.rpc_error(fake_e2b.Code.DEADLINE_EXCEEDED, "deadline exceeded")
        assert type(deadline) is e2b.TimeoutException
        not_found = fake_e2b.rpc_error(fake_e2b.Code.NOT_FOUND, "no process")
        assert type(not_found) is e2b.NotFoundException
    finally:
        box.kill()
