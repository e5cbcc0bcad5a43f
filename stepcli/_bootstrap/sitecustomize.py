"""stepcli's bootstrap: the only file on the injected PYTHONPATH entry. Chains the sitecustomize it
shadows, then starts the agent. Logic lives in stepcli/agent; this file stays tiny and never
raises."""

import os
import sys


def _stepcli_chain() -> None:
    """Run the sitecustomize this one shadows, as site.py would have (errors reported, never
    fatal)."""
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    others = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.stderr.write(
            f"Error in sitecustomize; set PYTHONVERBOSE for traceback:\n{type(exc).__name__}: "
            f"{exc}\n"
        )


def _stepcli_activate() -> None:
    config = os.environ.get("STEPCLI_CONFIG")
    if not config:
        return
    import importlib.util

    agent_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "agent")
    name = "_stepcli_agent"  # a private name: works even where stepcli itself is not installed
    package = sys.modules.get(name)
    if package is None:
        spec = importlib.util.spec_from_file_location(
            name, os.path.join(agent_dir, "__init__.py"), submodule_search_locations=[agent_dir]
        )
        if spec is None or spec.loader is None:
            raise ImportError(f"stepcli's agent is missing from {agent_dir}")
        package = importlib.util.module_from_spec(spec)
        sys.modules[name] = package
        spec.loader.exec_module(package)
    from _stepcli_agent.runtime import activate

    activate(config)


try:
    _stepcli_chain()
finally:
    try:
        _stepcli_activate()
    except BaseException as _exc:  # the program runs untouched whatever happens here
        try:
            sys.stderr.write(
                f"stepcli: profiling disabled in this process: {type(_exc).__name__}: {_exc}\n"
            )
        except Exception:
            pass
