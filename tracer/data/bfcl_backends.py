"""BFCL's executable backends: one live instance per API class, per task. The free-running environment
that runs a model's calls on them is :mod:`tracer.envs.bfcl`; the dataset reader replays gold calls on them.

:class:`BFCLBackends` runs tool calls on fresh instances of the BFCL multi-turn backend classes
(``bfcl_eval/eval_checker/multi_turn_eval/func_source_code``), loaded from a task's
``initial_config`` exactly as BFCL's own checker loads them (``multi_turn_utils.
execute_multi_turn_func_call``): a deep copy of the class's config goes to ``_load_scenario`` with
``long_context`` set for the long-context category, and stateless classes (``MathAPI``) are not
loaded. Unlike BFCL, the instances live on the environment object rather than in module globals
keyed by model name, so two environments never share state.

Results are rendered the way BFCL renders them (a string stays a string, a dict becomes JSON,
anything else ``str()``), and a call that raises becomes ``"Error during execution: ..."``, BFCL's
own wording. A backend that *reports* a failure (``{"error": ...}``) has not raised: that is a
normal result and is not counted as an execution error.

State is what BFCL's ``state_checker`` compares: every instance attribute not starting with ``_``.
:func:`gold_states` replays a trajectory's gold calls and snapshots that state after each turn, so
free-running evaluation can check a model's state against it turn by turn.

Example::

    env = BFCLBackends(["GorillaFileSystem"], {"GorillaFileSystem": {"root": {...}}})
    env.execute("ls", {"a": True})      # '{"current_directory_content": [...]}'
    env.state()                         # {"GorillaFileSystem": {"root": <Directory ...>, ...}}
"""

from __future__ import annotations

import copy
import functools
import importlib
import inspect
import json
from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

from tracer.core.types import Trajectory

# The eight classic multi-turn API classes and their families (function-doc file stems); BFCL v4's
# memory and web-search backends are left out. Checked against bfcl_eval's own mapping in the tests.
FAMILY_OF: dict[str, str] = {
    "GorillaFileSystem": "gorilla_file_system", "MathAPI": "math_api", "MessageAPI": "message_api",
    "TwitterAPI": "posting_api", "TicketAPI": "ticket_api", "TradingBot": "trading_bot",
    "TravelAPI": "travel_booking", "VehicleControlAPI": "vehicle_control",
}
CLASSIC_CLASSES: tuple[str, ...] = tuple(FAMILY_OF)

ERROR_PREFIX = "Error during execution: "

State = dict[str, dict[str, Any]]


def backend_config():
    """``bfcl_eval``'s backend table, imported on first use so that ``tracer.data`` imports without it."""
    try:
        from bfcl_eval.constants import executable_backend_config
    except ModuleNotFoundError as e:
        raise ModuleNotFoundError("the BFCL loader needs the bfcl_eval package (pip install bfcl-eval)",
                                  name=e.name) from e
    return executable_backend_config


def backend_class(class_name: str) -> type:
    """The backend class for a BFCL class name (``GorillaFileSystem`` ...)."""
    paths = backend_config().CLASS_FILE_PATH_MAPPING
    if class_name not in paths:
        raise KeyError(f"unknown BFCL class {class_name!r}; valid names: {', '.join(sorted(paths))}")
    return getattr(importlib.import_module(paths[class_name]), class_name)


@functools.cache
def public_methods(class_name: str) -> Mapping[str, inspect.Signature]:
    """Name -> signature (without ``self``) of every public method of a backend class: its tools.

    Cached: every task's backends ask for their classes' methods, and reading the signatures was half the
    time of loading BFCL (1,348 calls for 800 tasks); read-only, since the cache shares it."""
    cls = backend_class(class_name)
    out = {}
    for name, fn in inspect.getmembers(cls, inspect.isfunction):
        if not name.startswith("_"):
            sig = inspect.signature(fn)
            out[name] = sig.replace(parameters=list(sig.parameters.values())[1:])
    return MappingProxyType(out)


def render_result(result: Any) -> str:
    """A call's return value as BFCL puts it in the conversation."""
    if isinstance(result, str):
        return result
    if isinstance(result, dict):
        try:
            return json.dumps(result)
        except (TypeError, ValueError):  # e.g. a set or an object inside
            return str(result)
    return str(result)


class BFCLBackends:
    """Live BFCL backend instances for one task.

    Args:
        involved_classes: the task's API classes (``involved_classes`` in the BFCL entry).
        initial_config: the task's ``initial_config``; not modified (each class gets a deep copy).
        long_context: load the scenario in BFCL's long-context mode (the ``long_context`` category).

    Attributes:
        errors: number of calls so far that raised (or named no tool, or had unusable arguments).
        calls: number of calls executed so far.
    """

    def __init__(self, involved_classes: Sequence[str], initial_config: Mapping[str, Any] | None = None,
                 long_context: bool = False):
        initial_config = initial_config or {}
        self.long_context = bool(long_context)
        self.instances: dict[str, Any] = {}
        self._owner: dict[str, str] = {}  # method name -> class name
        stateless = backend_config().STATELESS_CLASSES
        for class_name in involved_classes:
            instance = backend_class(class_name)()
            if class_name not in stateless:
                instance._load_scenario(copy.deepcopy(dict(initial_config.get(class_name, {}))),
                                        long_context=self.long_context)
            self.instances[class_name] = instance
            for name in public_methods(class_name):
                self._owner[name] = class_name  # later classes win, as in BFCL (no overlap in practice)
        self.errors = 0
        self.calls = 0

    @classmethod
    def from_metadata(cls, metadata: Mapping[str, Any]) -> BFCLBackends:
        """Build from a BFCL trajectory's metadata (``involved_classes``, ``initial_config``,
        ``long_context``)."""
        for key in ("involved_classes", "initial_config"):
            if key not in metadata:
                raise KeyError(f"BFCL metadata lacks {key!r}; is this a trajectory from the bfcl loader?")
        long_context = metadata.get("long_context", "long_context" in str(metadata.get("category", "")))
        return cls(metadata["involved_classes"], metadata["initial_config"], long_context=long_context)

    @property
    def tools(self) -> tuple[str, ...]:
        """Names of the tools this environment can execute."""
        return tuple(self._owner)

    def execute(self, name: str, arguments: Mapping[str, Any] | str | None = None) -> str:
        """Run one call and return its result string; failures come back as an error string, never raised."""
        self.calls += 1
        try:
            if isinstance(arguments, str):
                arguments = json.loads(arguments) if arguments.strip() else {}
            # a copy, as BFCL evaluates fresh literals: backends keep argument lists (e.g. a tweet's
            # mentions) and extend them later, which must not reach the caller's data
            arguments = copy.deepcopy(dict(arguments or {}))
            if name not in self._owner:
                raise NameError(f"no tool named {name!r} among {', '.join(self.instances)}")
            result = getattr(self.instances[self._owner[name]], name)(**arguments)
        except Exception as e:  # noqa: BLE001  (a backend failure is a result, as in BFCL)
            self.errors += 1
            return f"{ERROR_PREFIX}{e}"
        return render_result(result)

    def _public_state(self) -> State:
        return {c: {k: v for k, v in vars(inst).items() if not k.startswith("_")}
                for c, inst in self.instances.items()}

    def state(self) -> State:
        """Class name -> the instance's public attributes (a deep copy: later calls do not change it)."""
        return copy.deepcopy(self._public_state())

    def same_state(self, other: BFCLBackends | Mapping[str, Any]) -> bool:
        """Whether every instance has the same public attributes as in ``other`` (an env or a state)."""
        theirs = other._public_state() if isinstance(other, BFCLBackends) else other
        return self._public_state() == dict(theirs)

    def __repr__(self) -> str:
        return f"BFCLBackends({list(self.instances)}, calls={self.calls}, errors={self.errors})"


def gold_states(traj: Trajectory) -> list[State]:
    """The state after each turn when a trajectory's tool calls are replayed on a fresh environment.

    One state per turn, in the turn numbering of :func:`tracer.core.steps.extract_steps` (each user
    message opens a turn; calls before the first user message belong to turn 0), turns without
    calls included.
    """
    env = BFCLBackends.from_metadata(traj.metadata)
    states: list[State] = []
    started = False
    for m in traj.messages:
        role = m.get("role")
        if role == "user":
            if started:
                states.append(env.state())
            started = True
        elif role == "assistant":
            for call in m.get("tool_calls") or ():
                started = True
                fn = call.get("function", call)
                env.execute(fn["name"], fn.get("arguments") or {})
    if started:
        states.append(env.state())
    return states


def withheld_tools(metadata: Mapping[str, Any], turn: int) -> frozenset[str]:
    """The tools BFCL has not yet given the model at ``turn`` (``miss_func``: ``missed_function``
    maps the turn where a function is added, as a string, to its names; empty for other categories)."""
    missed = metadata.get("missed_function") or {}
    return frozenset(name for t, names in missed.items() if int(t) > turn for name in names)
