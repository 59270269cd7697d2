"""One registry class for every extension axis: operators, graph kinds, tasks.

A :class:`Registry` maps names to classes. Each class is checked once, when it is registered
(:meth:`Registry.register`, usable as a class decorator), by the checks its axis declares;
looking a name up (:meth:`Registry.lookup`, ``registry[name]``) lists the valid names and
suggests the closest when it is wrong, and :meth:`Registry.resolve` turns a spec string
``name[key=value,...]`` (the grammar of :mod:`heatformer._spec`) or a name and
keyword arguments into an instance, refusing parameters the class does not take. It is the
one place where strings become objects.

:data:`heatformer.graph_ops.OPERATORS`, :data:`heatformer.graph_ops.GRAPHS` and the lab's
:data:`heatformer.lab.tasks.TASKS` are its instances. Tables that are not extension axes (the
heat-kernel methods, the normalizations) stay plain constants.

Example:
    >>> from heatformer.graph_ops import GRAPHS, OPERATORS
    >>> "heat" in OPERATORS, OPERATORS["heat"].__name__
    (True, 'HeatKernel')
    >>> OPERATORS.resolve("heat[t=0.5]")
    HeatKernel(t=0.5, normalization='rw', method='auto', tol=1e-06, learnable=False)
    >>> GRAPHS.resolve("topk[k=32]")
    TopkBuilder('topk[k=32]')
    >>> try:
    ...     GRAPHS.resolve("windw[w=4]")
    ... except ValueError as err:
    ...     print(err)
    graph: expected one of ['softmax', 'topk', 'window'], got 'windw' in 'windw[w=4]' (did you mean 'window'?)
"""  # noqa: E501

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from heatformer import checks as V
from heatformer._suggest import did_you_mean

__all__ = ["Registry"]

T = TypeVar("T", bound=type)

#: what a registered name may be: a letter or ``_``, then letters, digits, ``_`` or ``-``
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*\Z")


class Registry(Mapping[str, T]):
    """Names -> classes of one extension axis, each checked once when registered.

    Args:
        kind: what an entry is, in messages (``"operator"``, ``"graph kind"``, ``"task"``).
        argument: the argument that errors name (their ``.argument``): ``"name"``,
            ``"graph"``, ``"task"``.
        base: the class every entry subclasses; an instance of it passes :meth:`resolve`
            unchanged.
        check: the axis's own check of a class (beyond being a ``base`` subclass with a
            ``name``), run once at registration; raises :class:`TypeError` or
            :class:`ValueError` naming ``argument``.
        aliases: other names of entries (``{"pagerank": "ppr"}``); a lookup accepts them and
            an unknown name's message lists them.
        case_insensitive: names are looked up stripped and lower-cased.
        factory_kwargs: constructor arguments that are not parameters of the spec
            (``device``, ``dtype``): :meth:`resolve` passes them only to classes that take
            them, and a spec may not set them.
        examples: every entry declares ``examples``, a non-empty tuple of parameter dicts
            that its constructor takes (the combination matrix of the tests builds each one).

    A read-only :class:`~collections.abc.Mapping`: every entry's ``name`` is its key; iteration
    yields the names in registration order; ``in``, ``len``, ``items()``, ``values()``,
    ``get()`` and ``==`` (against any mapping) work as on a dict, and ``registry[name]`` is
    :meth:`lookup` (an unknown name raises its :class:`ValueError`). Entries are added only
    through :meth:`register` (``registry[name] = cls`` is refused: it would skip the checks).
    """

    def __init__(
        self,
        kind: str,
        *,
        argument: str,
        base: type,
        check: Callable[[Any], object] | None = None,
        aliases: Mapping[str, str] | None = None,
        case_insensitive: bool = False,
        factory_kwargs: tuple[str, ...] = (),
        examples: bool = False,
    ) -> None:
        self.kind, self.argument, self.base = kind, argument, base
        self.aliases = dict(aliases or {})
        self.case_insensitive = case_insensitive
        self.factory_kwargs = factory_kwargs
        self._checks: list[Callable[[Any], object]] = [self._check_examples] if examples else []
        self._checks += [check] if check is not None else []
        self._entries: dict[str, T] = {}

    # ---- registration ---------------------------------------------------------------------

    def register(self, cls: T, *, replace: bool = False) -> T:
        """Add ``cls`` under ``_name_of(cls)`` after checking it; returns ``cls`` (a decorator).

        Args:
            cls: a subclass of :attr:`base` with a ``name``.
            replace: allow replacing another class registered under the same name.

        Raises:
            TypeError: ``cls`` is not a subclass of :attr:`base`.
            ValueError: a missing or malformed name, a name taken by another class (without
                ``replace``) or by an alias, or what the axis's checks refuse.
        """
        self._check(cls)
        name = _name_of(cls)
        taken = self._entries.get(name)
        if taken is not None and taken is not cls and not replace:
            raise V.bad_value(
                self.argument,
                f"{name!r} is already registered ({taken.__name__}); pass replace=True",
            )
        if name in self.aliases:
            raise V.bad_value(
                self.argument,
                f"{name!r} is an alias of {self.aliases[name]!r}; choose another name",
            )
        self._entries[name] = cls
        return cls

    def add_check(self, check: Callable[[Any], object]) -> None:
        """Add a check that every entry must pass: run now on the registered ones, and at the
        registration of every later one (a rule that another part of the code owns, e.g. the
        lab's: no task option may share a name with a spec field)."""
        for cls in self._entries.values():
            check(cls)
        self._checks.append(check)

    def _check(self, cls: object) -> None:
        if not (isinstance(cls, type) and issubclass(cls, self.base)):
            raise V.bad_type(
                self.argument,
                f"expected a subclass of {self.base.__module__}.{self.base.__qualname__}, "
                f"got {cls!r}",
            )
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not _NAME.match(name):
            raise V.bad_value(
                self.argument,
                f"{self.kind} {cls.__name__}: expected a name such as 'parity', got {name!r} (a "
                "letter or '_', then letters, digits, '_' or '-')",
            )
        if self.case_insensitive and name != name.lower():
            raise V.bad_value(
                self.argument,
                f"{self.kind} {cls.__name__}: expected a lower-case name, got {name!r}",
            )
        for check in self._checks:
            check(cls)

    def unregister(self, name: str) -> T:
        """Remove the entry ``name`` and return its class (a plugin unloaded, a test's entry)."""
        cls = self.lookup(name)
        del self._entries[_name_of(cls)]
        return cls

    def _check_examples(self, cls: type) -> None:
        examples = getattr(cls, "examples", None)
        if not (
            isinstance(examples, tuple) and examples and all(type(e) is dict for e in examples)
        ):
            raise V.bad_value(
                self.argument,
                f"{self.kind} {cls.__name__}: expected examples, a tuple of parameter dicts, "
                f"got {examples!r}",
            )
        accepted = {*self.accepted(cls), *getattr(cls, "spec_aliases", {})}
        for example in examples:
            unknown = sorted(set(example) - accepted)
            if unknown:
                raise V.bad_value(
                    self.argument,
                    f"{self.kind} {cls.__name__}: example {example} has parameter(s) {unknown} "
                    f"that its constructor does not take ({sorted(accepted)})",
                )

    def __setitem__(self, name: str, cls: T) -> None:
        raise TypeError(
            f"{self.kind}s are added with .register(cls), which checks them (cls.name is the "
            f"key), not by assignment"
        )

    # ---- lookup ---------------------------------------------------------------------------

    def lookup(self, name: object, *, context: str = "") -> T:
        """The class registered as ``name`` (or an alias of it).

        Args:
            name: the name.
            context: text after the name in a message, e.g. ``" in 'windw[w=4]'"``.

        Raises:
            ValueError: an unknown name: the message lists the names (and aliases) and
                suggests the closest.
            TypeError: ``name`` is not a string.
        """
        if not isinstance(name, str):
            raise V.bad_type(
                self.argument, f"expected {_a(self.kind)} name, got {type(name).__name__}"
            )
        key = name.strip().lower() if self.case_insensitive else name
        key = self.aliases.get(key, key)
        if key in self._entries:
            return self._entries[key]
        if not self.aliases:
            V.check_choice(self.argument, key, sorted(self._entries), context=context)
        hint = did_you_mean(key, [*self._entries, *self.aliases])
        raise V.bad_value(
            self.argument,
            f"unknown {self.kind} {name!r}{context}{hint}; expected one of {sorted(self._entries)} "
            f"(aliases: {sorted(self.aliases)})",
        )

    def __getitem__(self, name: str) -> T:
        return self.lookup(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(list(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, name: object, default: Any = None) -> Any:
        """The class registered as ``name`` exactly (no alias, no case folding), else
        ``default``."""
        return self._entries.get(name, default) if isinstance(name, str) else default

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {list(self._entries)})"

    # ---- resolving ------------------------------------------------------------------------

    def accepted(self, cls: type) -> list[str]:
        """The parameters a spec may give ``cls``: its constructor's named arguments, less the
        factory ones."""
        skip = {"self", *self.factory_kwargs}
        return [
            p.name
            for p in inspect.signature(cls).parameters.values()
            if p.name not in skip and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]

    def resolve(self, spec: object, **kwargs: Any) -> Any:
        """An instance from a spec string ``name[key=value,...]`` or a name and ``kwargs``; an
        instance of :attr:`base` passes unchanged.

        Parameter names may be the class's ``spec_aliases`` (``global`` for ``num_global``).
        ``kwargs`` may also hold the factory arguments (``device``, ``dtype``), passed to the
        classes that take them.

        Raises:
            ValueError: an unknown name, bad syntax, a parameter the class does not take given in
                the spec string, or a value the class refuses (naming :attr:`argument`).
            TypeError: ``spec`` of another type, an instance given with ``kwargs``, or a keyword
                argument the class does not take (naming the entry).
        """
        from heatformer._spec import parse_entry

        if isinstance(spec, self.base):
            if any(k not in self.factory_kwargs for k in kwargs):
                raise V.bad_type(
                    "kwargs", f"{_a(self.kind)} instance was given; it takes no keyword arguments"
                )
            return spec
        if not isinstance(spec, str):
            raise V.bad_type(
                self.argument,
                f"expected {_a(self.kind)} name or spec string, got {type(spec).__name__}",
            )
        name, params = parse_entry(spec, what=self.argument) if "[" in spec else (spec, {})
        context = f" in {spec!r}" if params or "[" in spec else ""
        cls = self.lookup(name, context=context)
        key = _name_of(cls)
        factory = {k: kwargs.pop(k) for k in self.factory_kwargs if k in kwargs}
        params = self._spelled(key, spec, params)
        accepted = self.accepted(cls)
        for given, error in ((params, V.bad_value), (kwargs, V.bad_type)):
            unknown = sorted(set(given) - set(accepted))
            if unknown:
                where = (self.argument, f"{key}: ") if error is V.bad_value else (key, "")
                raise error(
                    where[0],
                    f"{where[1]}unknown parameter(s) {unknown}{context}; expected some of "
                    f"{accepted}",
                )
        both = sorted(set(params) & set(kwargs))
        if both:
            raise V.bad_type(key, f"{both} given both in {spec!r} and as keyword arguments")
        taken = set(inspect.signature(cls).parameters)
        factory = {k: v for k, v in factory.items() if v is not None and k in taken}
        try:
            return cls(**params, **kwargs, **factory)
        except (TypeError, ValueError) as err:
            if not kwargs:  # a spec string: one ValueError naming the argument and the spec
                raise V.bad_value(self.argument, f"in {spec!r}: {err}") from None
            if isinstance(err, TypeError):  # keyword arguments: a TypeError names the entry
                raise V.bad_type(key, f"{err}") from None
            raise

    def _spelled(self, key: str, spec: str, params: dict[str, object]) -> dict[str, object]:
        """``params`` with the class's ``spec_aliases`` mapped to its argument names; a name
        and its alias both given are refused."""
        aliases = getattr(self._entries[key], "spec_aliases", {})
        named: dict[str, object] = {}
        spelled: dict[str, str] = {}
        for name, value in params.items():
            arg = aliases.get(name, name)
            if arg in named:
                raise V.bad_value(
                    self.argument,
                    f"expected one of {spelled[arg]!r} and {name!r} in {spec!r} (both set {arg!r})",
                )
            named[arg], spelled[arg] = value, name
        return named


def _a(noun: str) -> str:
    """``"an operator"``, ``"a task"``."""
    return f"{'an' if noun[:1] in 'aeiou' else 'a'} {noun}"


def _name_of(cls: Any) -> str:
    """An entry's ``name`` (every registered class has one: :meth:`Registry.register` checks)."""
    name: str = cls.name
    return name
