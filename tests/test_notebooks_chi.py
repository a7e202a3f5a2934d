"""The notebooks' python-chi calls match the python-chi the lab pins, and only run on Chameleon.

The Chameleon cells cannot run in CI: they need credentials and a reservation. So instead of
running them, this test reads every notebook source, follows each value that comes from
python-chi (modules imported from `chi`, objects its functions and classes return, and the
variables they are assigned to), and checks every use against the installed library:

- an attribute that is read or assigned (`context.version = ...`, `lease.node_reservations`) must
  exist on the module, the class, or the class's instances;
- a call (`server.Server(...)`, `node.submit(...)`) must bind to the function's signature, the way
  Python binds arguments at call time (the values themselves are stand-ins).

Every such use must also sit in the body of an `if chameleon_only(...):` block, so that a
notebook elsewhere (LAB_SERVICES local or compose) skips it.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import re
import textwrap
import types
import typing
from dataclasses import dataclass
from functools import cache
from importlib import metadata
from pathlib import Path

import fabric.runners
import jupytext
import pytest
from IPython.core.inputtransformer2 import TransformerManager

from servelab import paths
from servelab.lab.notebook_runs import sources

SOURCES = sources()
GUARD = "chameleon_only"
# Fewer checked uses than this means the checker has stopped following the notebooks.
MIN_CHECKED_CHI_USES = 20

# What python-chi functions return where they carry no return annotation that says so, for the
# calls whose results the notebooks go on to use. Keyed by module-qualified name.
RETURN_TYPES: dict[str, type] = {
    # Server.execute returns whatever fabric's Connection.run returns.
    "chi.server.Server.execute": fabric.runners.Result,
}


@dataclass(frozen=True)
class Instance:
    """An object of a known class (a python-chi class, or one python-chi returns)."""

    cls: type


@dataclass(frozen=True)
class ListOf:
    cls: type


@dataclass(frozen=True)
class Method:
    cls: type
    name: str


@dataclass(frozen=True)
class Untyped:
    """A value python-chi returned without saying what it is: nothing called on it can be checked."""

    origin: str


@dataclass
class Use:
    """One use of python-chi in a notebook, and what the check found."""

    where: str
    what: str
    problem: str | None
    guarded: bool
    is_chi: bool


class _StandIn:
    def __repr__(self) -> str:
        return "<argument>"


def _is_chi(obj: object) -> bool:
    if isinstance(obj, types.ModuleType):
        return obj.__name__ == "chi" or obj.__name__.startswith("chi.")
    if isinstance(obj, (Instance, ListOf, Method)):
        return _is_chi(obj.cls)
    if isinstance(obj, Untyped):
        return True
    module = getattr(obj, "__module__", None) or ""
    return module == "chi" or module.startswith("chi.")


def _qualified_name(obj: object) -> str:
    if isinstance(obj, Method):
        return f"{obj.cls.__module__}.{obj.cls.__qualname__}.{obj.name}"
    return f"{obj.__module__}.{obj.__qualname__}"


@cache
def instance_attributes(cls: type) -> frozenset[str]:
    """Every attribute an instance of `cls` has: the class's own, dataclass fields, and `self.x = ...`."""
    names = set(dir(cls))
    if dataclasses.is_dataclass(cls):
        names.update(field.name for field in dataclasses.fields(cls))
    for klass in cls.__mro__:
        if klass is object:
            continue
        names.update(getattr(klass, "__annotations__", {}))
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
            ):
                names.add(node.attr)
    return frozenset(names)


def _value_of_type(hint: object, origin: str) -> object:
    """What the checker knows about a value from a type annotation."""
    if hint is type(None):
        return None
    args = [arg for arg in typing.get_args(hint) if arg is not type(None)]
    container = typing.get_origin(hint)
    if container is typing.Union and len(args) == 1:
        return _value_of_type(args[0], origin)
    if container is list and len(args) == 1 and isinstance(args[0], type):
        return ListOf(args[0])
    if isinstance(hint, type):
        return Instance(hint)
    return Untyped(origin)


def _return_value(func: object) -> object:
    name = _qualified_name(func)
    if name in RETURN_TYPES:
        return Instance(RETURN_TYPES[name])
    target = getattr(func.cls, func.name) if isinstance(func, Method) else func
    try:
        hints = typing.get_type_hints(target)
    except Exception:  # python-chi has annotations that do not evaluate (names it never imports)
        hints = {}
    if "return" in hints:
        return _value_of_type(hints["return"], name)
    return Untyped(name) if _is_chi(func) else None


def _signature(func: object) -> tuple[inspect.Signature, bool]:
    """The signature to bind a call against, and whether the call passes `self` implicitly."""
    if isinstance(func, Method):
        raw = inspect.getattr_static(func.cls, func.name)
        if isinstance(raw, staticmethod):
            return inspect.signature(raw.__func__), False
        if isinstance(raw, classmethod):
            return inspect.signature(getattr(func.cls, func.name)), False
        if not inspect.isfunction(raw):
            raise TypeError(f"{func.name} is not a method of {func.cls.__qualname__}")
        return inspect.signature(raw), True
    return inspect.signature(func), False


class ChiUseChecker:
    """Follows python-chi values through notebook cells, in order, and checks each use."""

    def __init__(self, name: str):
        self.name = name
        self.env: dict[str, object] = {}
        self.uses: list[Use] = []
        self._parents: dict[ast.AST, ast.AST] = {}
        self._cell = 0

    # ---- input --------------------------------------------------------------------------

    def check_cell(self, source: str) -> None:
        self._cell += 1
        tree = ast.parse(TransformerManager().transform_cell(source))
        self._parents = {child: parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
        self._run(tree.body)

    # ---- statements ---------------------------------------------------------------------

    def _run(self, statements: list[ast.stmt]) -> None:
        for statement in statements:
            self._statement(statement)

    def _statement(self, node: ast.stmt) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname:
                    self.env[alias.asname] = self._import(alias.name)
                else:
                    top = alias.name.split(".")[0]
                    self._import(alias.name)
                    self.env[top] = self._import(top)
        elif isinstance(node, ast.ImportFrom):
            module = self._import(node.module) if node.module and not node.level else None
            for alias in node.names:
                value = None
                if module is not None:
                    try:  # a submodule (chi.lease) or a name defined in the module
                        value = self._import(f"{node.module}.{alias.name}")
                    except ImportError:
                        value = getattr(module, alias.name, None)
                    problem = None if value is not None else f"{node.module} has no {alias.name!r}"
                    self._record(node, f"import {node.module}.{alias.name}", problem, guarded=True)
                self.env[alias.asname or alias.name] = value
        elif isinstance(node, ast.Assign):
            value = self._eval(node.value)
            for target in node.targets:
                self._assign(target, value)
        elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
            value = self._eval(node.value) if node.value is not None else None
            self._assign(node.target, value if isinstance(node, ast.AnnAssign) else None)
        elif isinstance(node, (ast.For, ast.AsyncFor)):
            iterable = self._eval(node.iter)
            self._assign(node.target, Instance(iterable.cls) if isinstance(iterable, ListOf) else None)
            self._run(node.body)
            self._run(node.orelse)
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                self._eval(item.context_expr)
                if item.optional_vars is not None:
                    self._assign(item.optional_vars, None)
            self._run(node.body)
        else:
            # Everything else (if, while, try, def, raise, expressions...): check each expression
            # in it, and follow each block of statements in order.
            for _, child in ast.iter_fields(node):
                for item in child if isinstance(child, list) else [child]:
                    if isinstance(item, ast.stmt):
                        self._statement(item)
                    elif isinstance(item, ast.expr):
                        self._eval(item)
                    elif isinstance(item, ast.excepthandler):
                        self._run(item.body)

    def _assign(self, target: ast.expr, value: object) -> None:
        if isinstance(target, ast.Name):
            self.env[target.id] = value
        elif isinstance(target, (ast.Tuple, ast.List)):
            for element in target.elts:
                self._assign(element, None)
        elif isinstance(target, ast.Attribute):
            self._attribute(self._eval(target.value), target.attr, target, assigned=True)
        else:
            self._eval(target)

    @staticmethod
    def _import(module: str) -> object:
        """The module, if it is part of python-chi; other imports are not followed."""
        if module.split(".")[0] != "chi":
            return None
        return __import__(module, fromlist=["_"])

    # ---- expressions --------------------------------------------------------------------

    def _eval(self, node: ast.expr) -> object:
        if isinstance(node, ast.Name):
            return self.env.get(node.id)
        if isinstance(node, ast.Attribute):
            return self._attribute(self._eval(node.value), node.attr, node)
        if isinstance(node, ast.Call):
            return self._call(node)
        if isinstance(node, ast.NamedExpr):
            value = self._eval(node.value)
            self._assign(node.target, value)
            return value
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.expr):
                self._eval(child)
            elif isinstance(child, ast.comprehension):
                self._eval(child.iter)
                for condition in child.ifs:
                    self._eval(condition)
        return None

    def _attribute(self, base: object, name: str, node: ast.expr, assigned: bool = False) -> object:
        verb = "set" if assigned else "read"
        if isinstance(base, types.ModuleType) and _is_chi(base):
            found = hasattr(base, name)
            problem = None if found else f"module {base.__name__} has no attribute {name!r}"
            self._record(node, f"{verb} {base.__name__}.{name}", problem)
            return getattr(base, name, None)
        if isinstance(base, type) and _is_chi(base):
            found = hasattr(base, name)
            problem = None if found else f"class {base.__qualname__} has no attribute {name!r}"
            self._record(node, f"{verb} {_qualified_name(base)}.{name}", problem)
            return Method(base, name) if found and callable(getattr(base, name)) else None
        if isinstance(base, Instance):
            found = name in instance_attributes(base.cls)
            self._record(
                node,
                f"{verb} {base.cls.__qualname__}().{name}",
                None if found else f"{base.cls.__qualname__} objects have no attribute {name!r}",
                is_chi=_is_chi(base),
            )
            on_class = inspect.getattr_static(base.cls, name, None)
            is_method = inspect.isfunction(on_class) or isinstance(on_class, (staticmethod, classmethod))
            return Method(base.cls, name) if is_method else None
        if isinstance(base, Untyped):
            return Untyped(f"{base.origin}(...).{name}")
        return None

    def _call(self, node: ast.Call) -> object:
        func = self._eval(node.func)
        for argument in [*node.args, *(keyword.value for keyword in node.keywords)]:
            self._eval(argument.value if isinstance(argument, ast.Starred) else argument)
        if isinstance(func, Untyped):
            problem = f"nothing says what {func.origin} is: add its return type to RETURN_TYPES"
            self._record(node, f"call {func.origin}", problem)
            return None
        checked = isinstance(func, Method) or (callable(func) and _is_chi(func))
        if not checked:
            return None
        name = _qualified_name(func)
        if any(isinstance(arg, ast.Starred) for arg in node.args) or any(kw.arg is None for kw in node.keywords):
            problem = "*args or **kwargs: the checker cannot bind this call"
            self._record(node, f"call {name}", problem, is_chi=_is_chi(func))
            return None
        try:
            signature, takes_self = _signature(func)
            stand_ins = [_StandIn() for _ in range(len(node.args) + takes_self)]
            bound = signature.bind(*stand_ins, **{keyword.arg: _StandIn() for keyword in node.keywords})
            # A keyword that only lands in **kwargs binds whatever it is (Server.submit passes them on
            # to Nova, Server.execute to fabric): it could be a typo, and nothing here can tell.
            passed_on = [
                keyword
                for parameter in signature.parameters.values()
                if parameter.kind is parameter.VAR_KEYWORD
                for keyword in bound.arguments.get(parameter.name, {})
            ]
            problem = f"{', '.join(passed_on)}: not a named parameter, only **kwargs takes it" if passed_on else None
        except TypeError as error:
            problem = str(error)
        self._record(node, f"call {name}", problem, is_chi=_is_chi(func))
        if isinstance(func, type):
            return Instance(func)
        return _return_value(func)

    # ---- results ------------------------------------------------------------------------

    def _record(
        self, node: ast.AST, what: str, problem: str | None, is_chi: bool = True, guarded: bool = False
    ) -> None:
        """One checked use. Imports count as guarded: importing python-chi needs no credentials."""
        where = f"{self.name}, code cell {self._cell}, line {getattr(node, 'lineno', '?')}"
        self.uses.append(Use(where, what, problem, guarded or self._guarded(node), is_chi))

    def _guarded(self, node: ast.AST) -> bool:
        """Whether `node` is in the body of an `if chameleon_only(...)` (possibly `and`-ed) block."""
        child, parent = node, self._parents.get(node)
        while parent is not None:
            in_body = isinstance(parent, ast.If) and any(child is statement for statement in parent.body)
            if in_body and _is_guard(parent.test):
                return True
            child, parent = parent, self._parents.get(parent)
        return False


def _is_guard(test: ast.expr) -> bool:
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return any(_is_guard(value) for value in test.values)
    return isinstance(test, ast.Call) and isinstance(test.func, ast.Name) and test.func.id == GUARD


def check_cells(name: str, cells: list[str]) -> list[Use]:
    checker = ChiUseChecker(name)
    for cell in cells:
        checker.check_cell(cell)
    return checker.uses


def notebook_uses(source: Path) -> list[Use]:
    notebook = jupytext.read(source)
    return check_cells(source.name, [cell.source for cell in notebook.cells if cell.cell_type == "code"])


def _all_uses() -> list[Use]:
    """Every checked use: python-chi's, and those of the objects it returns (fabric's Result)."""
    return [use for source in SOURCES for use in notebook_uses(source)]


# ---- the notebooks ---------------------------------------------------------------------------


def test_the_installed_python_chi_is_the_pinned_release():
    pin = re.search(r'"python-chi==([^"]+)"', (paths.REPO_ROOT / "pyproject.toml").read_text())
    assert pin, "pyproject.toml should pin python-chi: the notebooks are checked against one release"
    assert metadata.version("python-chi") == pin.group(1)


def test_every_python_chi_call_and_attribute_in_the_notebooks_exists_and_binds():
    problems = [f"{use.where}: {use.what}: {use.problem}" for use in _all_uses() if use.problem]
    assert not problems, "python-chi uses that do not match the installed release:\n" + "\n".join(problems)
    uses = [use for use in _all_uses() if use.is_chi]
    calls = [use for use in uses if use.what.startswith("call ")]
    assert len(uses) >= MIN_CHECKED_CHI_USES and len(calls) >= MIN_CHECKED_CHI_USES // 2, (
        f"only {len(uses)} python-chi uses ({len(calls)} calls) were checked: is the checker still "
        f"following the notebooks?\n" + "\n".join(f"{use.where}: {use.what}" for use in uses)
    )


def test_every_python_chi_use_in_the_notebooks_is_guarded():
    unguarded = [f"{use.where}: {use.what}" for use in _all_uses() if not use.guarded]
    assert not unguarded, f"python-chi used outside an `if {GUARD}(...):` block:\n" + "\n".join(unguarded)


def test_the_python_chi_notebooks_use_the_apis_this_lab_depends_on():
    checked = {use.what for use in _all_uses() if use.is_chi}
    expected = {
        "set chi.context.version",
        "call chi.context.choose_project",
        "call chi.context.choose_site",
        "call chi.lease.Lease",
        "call chi.lease.Lease.add_node_reservation",
        "call chi.lease.Lease.submit",
        "call chi.lease.get_lease",
        "call chi.lease.Lease.show",
        "call chi.server.Server",
        "call chi.server.Server.submit",
        "call chi.server.Server.associate_floating_ip",
        "call chi.server.Server.check_connectivity",
        "call chi.server.Server.execute",
        "read Lease().node_reservations",
    }
    assert expected <= checked, f"not checked: {sorted(expected - checked)}"


# ---- the checker itself ------------------------------------------------------------------------

GOOD_CELLS = [
    "from chi import context, hardware, lease, server\nfrom servelab.lessons.node import chameleon_only",
    textwrap.dedent("""
        if chameleon_only("set up"):
            context.version = "1.0"
            context.choose_site(default="CHI@TACC")
            found = lease.get_lease("name")
            node = server.Server("n", reservation_id=found.node_reservations[0]["id"], image_name="img")
            node.submit(idempotent=True)
            for candidate in hardware.get_nodes(node_type="gpu_p100"):
                candidate.next_free_timeslot(minimum_hours=3)
            print(node.execute("true").stdout)
    """),
]


def test_the_checker_accepts_correct_guarded_calls():
    uses = check_cells("good", GOOD_CELLS)
    assert [use for use in uses if use.problem or not use.guarded] == []
    assert len([use for use in uses if use.what.startswith("call ")]) == 7


@pytest.mark.parametrize(
    "body, problem",
    [
        ('server.Server("n", nonexistent_kw=1)', "unexpected keyword argument 'nonexistent_kw'"),
        ('server.Server("n", "reservation", "image", None, None, "key", None, "net", "extra")', "too many positional"),
        ("lease.get_lease()", "missing a required argument: 'ref'"),
        ("lease.no_such_function('x')", "has no attribute 'no_such_function'"),
        ("from chi import no_such_module", "chi has no 'no_such_module'"),
        ('context.no_such_setting = "x"', "has no attribute 'no_such_setting'"),
        (
            'node = server.Server("n")\n    node.check_connectivity(no_such_option=True)',
            "unexpected keyword argument 'no_such_option'",
        ),
        ('node = server.Server("n")\n    node.submit(no_such_option=True)', "no_such_option: not a named parameter"),
        ('node = server.Server("n")\n    node.no_such_method()', "objects have no attribute 'no_such_method'"),
        ('found = lease.get_lease("x")\n    print(found.no_such_field)', "objects have no attribute 'no_such_field'"),
        (
            "for n in hardware.get_nodes():\n        n.next_free_timeslot(hours=3)",
            "unexpected keyword argument 'hours'",
        ),
        ('node = server.Server("n")\n    node.execute("true").stdout.strip()', None),
        ("lease.get_lease(*names)", "cannot bind"),
        ('lease.Lease("x").submit().anything()', "add its return type to RETURN_TYPES"),
    ],
    ids=lambda value: value.split("\n")[0][:40] if isinstance(value, str) else str(value),
)
def test_the_checker_catches_a_wrong_call_or_attribute(body, problem):
    cell = f'if chameleon_only("x"):\n    {body}\n'
    uses = check_cells("bad", [GOOD_CELLS[0], cell])
    problems = [use.problem for use in uses if use.problem]
    if problem is None:
        assert problems == [], "the checker flagged a correct call"
    else:
        assert any(problem in found for found in problems), f"expected {problem!r}, found {problems}"


@pytest.mark.parametrize(
    "cell",
    [
        'lease.get_lease("x")',
        'if True:\n    lease.get_lease("x")',
        'if chameleon_only("x"):\n    pass\nelse:\n    lease.get_lease("x")',
        'found = lease.get_lease("x") if chameleon_only("x") else None',
    ],
    ids=["top level", "other condition", "else branch", "conditional expression"],
)
def test_the_checker_catches_an_unguarded_call(cell):
    uses = check_cells("unguarded", [GOOD_CELLS[0], cell])
    assert uses and not all(use.guarded for use in uses)


def test_an_and_ed_guard_counts_as_a_guard():
    uses = check_cells("and", [GOOD_CELLS[0], 'if ready and chameleon_only("x"):\n    lease.get_lease("x")'])
    assert uses and all(use.guarded for use in uses)
