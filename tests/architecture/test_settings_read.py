"""Every setting is read by product code.

A setting nothing reads is a lie in `aivedio.toml`: the operator changes it and nothing happens. This test
enumerates every field of the settings model (`config.py`, recursively: sections, `[providers.*]`,
`[providers.*.models.*]`, each `[retry.<step>]`) and finds the reads in the product source by their
attribute path, with a small type inference over the AST: a value's type comes from parameter and return
annotations, from `self.x = ...` assignments and from local assignments and loops, and an attribute is a read
of field `f` only when the object it is read from is known to be the section that has `f`. So
`self._settings.webhooks.tolerance_s` in a service, `cfg.base_url` with `cfg: ProviderSettings`, or
`p = settings.polling; p.jitter` count; a bare `tolerance_s` somewhere else does not.

A `[retry.<step>]` key is read when the step's budget is taken (`settings.retry.budget(Step.X)` or
`settings.retry.x`) and the domain reads that field of a `RetryBudget`.

Validators in `config.py` do not count as reads (checking a value is not using it), nor does dumping the
whole model (`aivedio config show`).
"""

from __future__ import annotations

import ast
import typing
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel

from aivedio_engine import config
from aivedio_engine.domain.retry import RetryBudget

REPO = Path(__file__).resolve().parents[2]
PRODUCT_DIRS = ("aivedio_engine", "aivedio_cli", "tui")
CONFIG_FILE = REPO / "aivedio_engine" / "config.py"

#: fields that another piece of work wires; each needs its reason. Remove the entry with the wiring.
NOT_YET_READ: dict[str, str] = {}

Type = tuple[str, ...]  # ("cls", name) | ("map", *inner) | ("step", step) | ("budget",)
MODELS: dict[str, type[BaseModel]] = {
    name: obj
    for name, obj in vars(config).items()
    if isinstance(obj, type) and issubclass(obj, BaseModel) and obj.__module__ == config.__name__
}
MODELS["Settings"] = config.Settings
STEPS = tuple(config.RetrySettings.model_fields)
BUDGET_FIELDS = tuple(RetryBudget.__dataclass_fields__)
#: module-level aliases such as `Ctx = Annotated[AppContext, Depends(get_ctx)]`, filled by Program
ALIASES: dict[str, Type] = {}
ITER_TYPES = {"Iterator", "Iterable", "Generator", "AbstractContextManager", "ContextManager", "Optional", "Annotated"}


def _field_type(owner: str, name: str) -> Type | None:
    """The inferred type of a config field's value: a section, a mapping of sections, or a leaf (None)."""
    ann = MODELS[owner].model_fields[name].annotation
    if owner == "RetrySettings":
        return ("step", name)
    if isinstance(ann, type) and issubclass(ann, BaseModel):
        return ("cls", ann.__name__)
    if typing.get_origin(ann) is dict:
        inner = typing.get_args(ann)[1]
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            return ("map", "cls", inner.__name__)
    return None


def enumerate_settings() -> list[str]:
    """Every leaf path, `*` for a mapping key: `providers.*.models.*.price_per_second`, `retry.query.max_attempts`."""
    out: list[str] = []

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name in model.model_fields:
            t = _field_type(model.__name__, name)
            path = f"{prefix}{name}"
            if t is None:
                out.append(path)
            elif t[0] == "step":
                out.extend(f"{path}.{f}" for f in BUDGET_FIELDS)
            elif t[0] == "map":
                walk(MODELS[t[2]], f"{path}.*.")
            else:
                walk(MODELS[t[1]], f"{path}.")

    walk(config.Settings, "")
    return out


@dataclass
class Reads:
    fields: set[tuple[str, str]] = field(default_factory=set)  # (section class, field)
    steps: set[str] = field(default_factory=set)  # retry steps whose budget is taken
    budget_fields: set[str] = field(default_factory=set)  # RetryBudget attributes read
    methods: set[tuple[str, str]] = field(default_factory=set)  # config methods/properties used


def _annotation(node: ast.expr | None) -> Type | None:
    """A known type from an annotation: a class name, unwrapped from Optional/Annotated/Iterator/X | None."""
    if node is None:
        return None
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        try:
            return _annotation(ast.parse(node.value, mode="eval").body)
        except SyntaxError:
            return None
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return _annotation(node.left) or _annotation(node.right)
    if isinstance(node, ast.Subscript):
        head = node.value.attr if isinstance(node.value, ast.Attribute) else getattr(node.value, "id", "")
        if head in ITER_TYPES:
            first = node.slice.elts[0] if isinstance(node.slice, ast.Tuple) else node.slice
            return _annotation(first)
        return None
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
    return _named(name) if name else None


def _named(name: str) -> Type:
    if name == "RetryBudget":
        return ("budget",)
    return ALIASES.get(name, ("cls", name))


class Program:
    """Class attribute types and function return types over all product modules, then the reads."""

    def __init__(self, trees: dict[Path, ast.Module]) -> None:
        self.trees = trees
        self.attrs: dict[str, dict[str, Type]] = {}  # class → attribute → type
        self.returns: dict[str, Type] = {}  # function or method name → return type (names are unique enough)
        self.reads = Reads()
        for tree in trees.values():
            for stmt in tree.body:
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
                    if isinstance(stmt.value, ast.Subscript) and (t := _annotation(stmt.value)):
                        ALIASES[stmt.targets[0].id] = t
        for tree in trees.values():
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and (t := _annotation(node.returns)):
                    self.returns.setdefault(node.name, t)
                if isinstance(node, ast.ClassDef):
                    attrs = self.attrs.setdefault(node.name, {})
                    for stmt in node.body:
                        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
                            if t := _annotation(stmt.annotation):
                                attrs[stmt.target.id] = t
                        if isinstance(stmt, ast.FunctionDef) and (t := _annotation(stmt.returns)):
                            attrs[stmt.name] = t  # properties and shared_property
        for _ in range(3):  # `self.x = y` may depend on another class's attributes
            for tree in trees.values():
                self._scan(tree, record=False)
        for path, tree in trees.items():
            if path != CONFIG_FILE:
                self._scan(tree, record=True)
        self._expand_config_methods()

    # ------------------------------------------------------------------------------------------ scopes
    def _scan(self, tree: ast.Module, *, record: bool) -> None:
        def visit(node: ast.AST, cls: str | None) -> None:
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.ClassDef):
                    visit(child, child.name)
                elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                    self._function(child, cls, record)
                    visit(child, cls)
                else:
                    visit(child, cls)

        visit(tree, None)
        if record:
            self._walk(tree, {}, None)  # module-level code

    def _function(self, fn: ast.FunctionDef | ast.AsyncFunctionDef, cls: str | None, record: bool) -> None:
        env: dict[str, Type] = {}
        args = [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]
        for i, arg in enumerate(args):
            if cls is not None and i == 0 and arg.arg in ("self", "cls"):
                env[arg.arg] = _named(cls)
            elif t := _annotation(arg.annotation):
                env[arg.arg] = t
        for _ in range(2):  # locals may be bound from other locals
            for node in ast.walk(fn):
                self._bind(node, env, cls)
        if record:
            self._walk(fn, env, cls)

    def _bind(self, node: ast.AST, env: dict[str, Type], cls: str | None) -> None:
        if isinstance(node, ast.Assign | ast.AnnAssign | ast.NamedExpr):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            t = self.type_of(node.value, env) if node.value is not None else None
            if isinstance(node, ast.AnnAssign):
                t = t or _annotation(node.annotation)
            for target in targets:
                if t is None:
                    continue
                if isinstance(target, ast.Name):
                    env[target.id] = t
                elif (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id == "self"
                    and cls is not None
                ):
                    self.attrs.setdefault(cls, {})[target.attr] = t
        elif isinstance(node, ast.For | ast.comprehension):
            self._bind_loop(node.target, node.iter, env)
        elif isinstance(node, ast.withitem) and isinstance(node.optional_vars, ast.Name):
            if t := self.type_of(node.context_expr, env):
                env[node.optional_vars.id] = t

    def _bind_loop(self, target: ast.expr, it: ast.expr, env: dict[str, Type]) -> None:
        if isinstance(it, ast.Call) and isinstance(it.func, ast.Attribute):
            owner = self.type_of(it.func.value, env)
            if owner and owner[0] == "map":
                inner = owner[1:]
                if it.func.attr == "items" and isinstance(target, ast.Tuple) and len(target.elts) == 2:
                    if isinstance(target.elts[1], ast.Name):
                        env[target.elts[1].id] = inner
                elif it.func.attr == "values" and isinstance(target, ast.Name):
                    env[target.id] = inner

    # ------------------------------------------------------------------------------------------ types
    def type_of(self, node: ast.expr | None, env: dict[str, Type]) -> Type | None:
        if isinstance(node, ast.Name):
            return env.get(node.id)
        if isinstance(node, ast.Attribute):
            owner = self.type_of(node.value, env)
            return self._member(owner, node.attr) if owner else None
        if isinstance(node, ast.Subscript):
            owner = self.type_of(node.value, env)
            return owner[1:] if owner and owner[0] == "map" else None
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute):
                owner = self.type_of(func.value, env)
                if owner and owner[0] == "map" and func.attr == "get":
                    return owner[1:]
                if owner == ("cls", "RetrySettings") and func.attr == "budget":
                    return ("budget",)
                if owner and owner[0] == "step" and func.attr == "to_domain":
                    return ("budget",)
                return self.returns.get(func.attr)
            if isinstance(func, ast.Name):
                if func.id in MODELS or func.id in self.attrs:
                    return ("cls", func.id)
                return self.returns.get(func.id)
        return None

    def _member(self, owner: Type, attr: str) -> Type | None:
        if owner[0] == "cls" and owner[1] in MODELS:
            model = MODELS[owner[1]]
            if attr in model.model_fields:
                return _field_type(owner[1], attr)
            return None
        if owner[0] == "cls":
            return self.attrs.get(owner[1], {}).get(attr)
        return None

    # ------------------------------------------------------------------------------------------ reads
    def _walk(self, scope: ast.AST, env: dict[str, Type], cls: str | None) -> None:
        for node in ast.walk(scope):
            if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                owner = self.type_of(node.value, env)
                if owner:
                    self._read(owner, node.attr)
            elif isinstance(node, ast.Call):
                self._call(node, env)

    def _read(self, owner: Type, attr: str) -> None:
        r = self.reads
        if owner == ("budget",):
            if attr in BUDGET_FIELDS:
                r.budget_fields.add(attr)
            return
        if owner[0] == "step":
            if attr in BUDGET_FIELDS:
                r.steps.add(owner[1])
                r.budget_fields.add(attr)  # read off the settings object directly
            return
        if owner[0] != "cls" or owner[1] not in MODELS:
            return
        model = MODELS[owner[1]]
        if attr in model.model_fields:
            r.fields.add((owner[1], attr))
            if owner[1] == "RetrySettings":
                r.steps.add(attr)
        elif hasattr(model, attr):
            r.methods.add((owner[1], attr))

    def _call(self, node: ast.Call, env: dict[str, Type]) -> None:
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr == "budget":
            if self.type_of(func.value, env) == ("cls", "RetrySettings"):
                arg = node.args[0] if node.args else None
                if isinstance(arg, ast.Attribute) and isinstance(arg.value, ast.Name) and arg.value.id == "Step":
                    self.reads.steps.add(arg.attr.lower())
                else:  # the step is chosen at run time: any budget may be taken
                    self.reads.steps.update(STEPS)
        if isinstance(func, ast.Name) and func.id == "getattr" and node.args:
            owner = self.type_of(node.args[0], env)
            if owner and owner[0] == "cls" and owner[1] in MODELS:
                name = node.args[1] if len(node.args) > 1 else None
                if isinstance(name, ast.Constant) and isinstance(name.value, str):
                    self._read(owner, name.value)
                else:
                    for f in MODELS[owner[1]].model_fields:
                        self._read(owner, f)

    def _expand_config_methods(self) -> None:
        """A config property or method used by product code reads what its body reads (validators excluded)."""
        tree = self.trees[CONFIG_FILE]
        bodies: dict[tuple[str, str], ast.FunctionDef] = {
            (cls.name, fn.name): fn
            for cls in tree.body
            if isinstance(cls, ast.ClassDef)
            for fn in cls.body
            if isinstance(fn, ast.FunctionDef)
        }
        done: set[tuple[str, str]] = set()
        while pending := self.reads.methods - done:
            for key in pending:
                done.add(key)
                if key in bodies and key != ("RetrySettings", "budget"):
                    self._function(bodies[key], key[0], record=True)


def product_reads() -> Reads:
    trees = {}
    for top in PRODUCT_DIRS:
        for path in sorted((REPO / top).rglob("*.py")):
            trees[path] = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return Program(trees).reads


def dead_settings() -> list[str]:
    reads = product_reads()
    owners = _owners()
    dead = []
    for path in enumerate_settings():
        parts = path.split(".")
        if parts[0] == "retry":
            step, name = parts[1], parts[2]
            read = step in reads.steps and name in reads.budget_fields
        else:
            read = owners[path] in reads.fields
        if not read:
            dead.append(path)
    return dead


def _owners() -> dict[str, tuple[str, str]]:
    """Leaf path → (section class, field name)."""
    out: dict[str, tuple[str, str]] = {}

    def walk(model: type[BaseModel], prefix: str) -> None:
        for name in model.model_fields:
            t = _field_type(model.__name__, name)
            path = f"{prefix}{name}"
            out[path] = (model.__name__, name)
            if t and t[0] == "map":
                walk(MODELS[t[2]], f"{path}.*.")
            elif t and t[0] == "cls":
                walk(MODELS[t[1]], f"{path}.")

    walk(config.Settings, "")
    return out


def _allowed(path: str) -> bool:
    return path in NOT_YET_READ or any(k.endswith(".*") and path.startswith(k[:-1]) for k in NOT_YET_READ)


def test_every_setting_is_read_by_product_code() -> None:
    dead = [p for p in dead_settings() if not _allowed(p)]
    assert not dead, (
        "settings that no product code reads (wire them, delete them from config.py and aivedio.toml, "
        "or list them in NOT_YET_READ with the issue that wires them): " + ", ".join(dead)
    )


def test_the_allowlist_names_only_fields_that_exist_and_are_still_unread() -> None:
    dead = set(dead_settings())
    paths = set(enumerate_settings())
    for key in NOT_YET_READ:
        matches = {p for p in paths if p == key or (key.endswith(".*") and p.startswith(key[:-1]))}
        assert matches, f"NOT_YET_READ names {key!r}, which is not a setting"
        assert matches & dead, f"{key} is read now: remove it from NOT_YET_READ"


def test_the_analysis_sees_reads_through_sections_locals_and_annotations() -> None:
    """The inference must find each kind of read the product uses, or the main test proves nothing."""
    src = """
from aivedio_engine.config import ProviderSettings, Settings
class A:
    def __init__(self, settings: Settings, cfg: ProviderSettings) -> None:
        self._settings = settings
        self._cfg = cfg
    def f(self) -> None:
        self._settings.webhooks.tolerance_s
        p = self._settings.sweeper
        p.idle_grace_s
        self._cfg.base_url
        for _n, prov in self._settings.providers.items():
            for m in prov.models.values():
                m.max_duration_s
        self._settings.retry.budget(Step.QUERY)
def g(budget: RetryBudget) -> None:
    budget.max_attempts
class B:
    def __init__(self, tolerance_s: int) -> None:
        self.tolerance_s = tolerance_s
    def h(self, x: object) -> None:
        x.max_body_bytes
        self.tolerance_s
"""
    reads = Program({Path("m.py"): ast.parse(src), CONFIG_FILE: ast.parse(CONFIG_FILE.read_text())}).reads
    assert ("WebhookSettings", "tolerance_s") in reads.fields
    assert ("SweeperSettings", "idle_grace_s") in reads.fields
    assert ("ProviderSettings", "base_url") in reads.fields
    assert ("ModelSettings", "max_duration_s") in reads.fields
    assert "query" in reads.steps and reads.budget_fields == {"max_attempts"}
    # the same names on other objects are not reads of the settings
    assert ("WebhookSettings", "max_body_bytes") not in reads.fields
    assert ("ApiSettings", "max_body_bytes") not in reads.fields


def test_the_enumeration_reaches_every_section() -> None:
    paths = set(enumerate_settings())
    assert {
        "webhooks.tolerance_s",
        "providers.*.models.*.price_per_second",
        "providers.*.base_url",
        "retry.query.provider_switch_allowed",
        "sweeper.idle_grace_s",
        "broker.kind",
        "mode",
    } <= paths
    assert len(paths) > 140


# --- outbox routes ----------------------------------------------------------------------------------------------

#: routes declared ahead of their writer and consumer; each needs its reason
ROUTES_NOT_YET_USED: dict[str, str] = {}


def _route_uses() -> tuple[set[str], set[str]]:
    """(event types some product code writes, event types a `@consumes` actor consumes), by `EventType.X`."""
    written: set[str] = set()
    consumed: set[str] = set()
    for top in PRODUCT_DIRS:
        for path in sorted((REPO / top).rglob("*.py")):
            if path == REPO / "aivedio_engine" / "domain" / "events.py":
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            in_decorators: set[int] = set()
            for node in ast.walk(tree):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    for dec in node.decorator_list:
                        if isinstance(dec, ast.Call) and getattr(dec.func, "id", None) == "consumes":
                            for sub in ast.walk(dec):
                                in_decorators.add(id(sub))
                                if isinstance(sub, ast.Attribute) and getattr(sub.value, "id", None) == "EventType":
                                    consumed.add(sub.attr)
            for node in ast.walk(tree):
                if (
                    isinstance(node, ast.Attribute)
                    and getattr(node.value, "id", None) == "EventType"
                    and id(node) not in in_decorators
                ):
                    written.add(node.attr)
    return written, consumed


def test_every_outbox_route_has_a_writer_and_a_consumer() -> None:
    from aivedio_engine.domain.events import ROUTES

    written, consumed = _route_uses()
    unused = [
        f"{e.name} ({'no writer' if e.name not in written else 'no consumer'})"
        for e in ROUTES
        if (e.name not in written or e.name not in consumed) and e.name not in ROUTES_NOT_YET_USED
    ]
    assert not unused, "outbox routes nothing uses (wire, delete, or list in ROUTES_NOT_YET_USED): " + ", ".join(unused)
    for name in ROUTES_NOT_YET_USED:
        assert name not in written or name not in consumed, f"{name} is used now: remove it from ROUTES_NOT_YET_USED"
