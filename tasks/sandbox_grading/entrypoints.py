"""pytest's plugin autoload, without the work tree: loaded through PYTEST_PLUGINS.

The grader runs pytest with PYTEST_DISABLE_PLUGIN_AUTOLOAD=1, because autoload imports every
`pytest11` entry point of every distribution on sys.path, and the work tree is on sys.path: an
agent that adds `evil.dist-info/entry_points.txt` (or edits the repo's own `*.egg-info`) gets its
plugin loaded first thing. Tests still need the plugins the image installed (pytest-mock's
`mocker`, pytest-asyncio, ...), so this module loads those: every `pytest11` entry point of a
distribution that lives outside the work tree, under its entry point name (so `-p no:NAME` still
blocks it), at the moment pytest would have autoloaded it (PYTEST_PLUGINS are imported right
after `-p` options are processed).
"""

import os
import sys

from .files import inside


def _distributions():
    try:
        from importlib import metadata
    except ImportError:  # Python < 3.8
        try:
            import importlib_metadata as metadata
        except ImportError:
            return _pkg_resources_entry_points()
    found = []
    for dist in metadata.distributions():
        points = [ep for ep in getattr(dist, "entry_points", ()) if ep.group == "pytest11"]
        if points:
            found.append((str(dist.locate_file("")), dist, points))
    return found


def _pkg_resources_entry_points():
    try:
        import pkg_resources
    except ImportError:
        return []
    found = {}
    for ep in pkg_resources.iter_entry_points("pytest11"):
        found.setdefault(ep.dist.location, (ep.dist.location, ep.dist, []))[2].append(ep)
    return list(found.values())


def _workdir():
    plugin = sys.modules.get(__name__.rpartition(".")[0] + ".pytest_plugin")
    return getattr(plugin, "WORKDIR", None)


def load_trusted_entry_points(manager):
    workdir = _workdir()
    if workdir is None:  # no grader run in this process: load nothing
        return
    try:
        from pluggy._manager import DistFacade
    except ImportError:
        DistFacade = None
    for location, dist, points in _distributions():
        if not location or inside(os.path.abspath(location), workdir):
            continue
        for ep in points:
            if manager.is_blocked(ep.name) or manager.get_plugin(ep.name) is not None:
                continue
            plugin = ep.load()
            manager.register(plugin, name=ep.name)
            distinfo = getattr(manager, "_plugin_distinfo", None)
            if DistFacade is not None and isinstance(distinfo, list):
                distinfo.append((plugin, DistFacade(dist)))


def pytest_plugin_registered(plugin, manager):
    if plugin is sys.modules.get(__name__):
        load_trusted_entry_points(manager)
