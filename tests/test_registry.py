"""The one registry class: registration checked once, lookups with suggestions, spec strings.

``OPERATORS`` and ``GRAPHS`` (and the lab's ``TASKS``, in tests/lab) are its instances; here a
registry of toy classes exercises every path, and the real ones are checked to be instances
that resolve every registered example.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest

from heatformer._spec import format_entry
from heatformer.graph_ops import GRAPHS, OPERATORS, GraphBuilder, resolve_graph, resolve_operator
from heatformer.registry import Registry


class Thing:
    name: ClassVar[str] = ""
    examples: ClassVar[tuple[dict[str, Any], ...]] = ({},)
    spec_aliases: ClassVar[dict[str, str]] = {}

    def __init__(self, size: int = 1, *, device: str | None = None) -> None:
        if size < 1:
            raise ValueError(f"size: expected >= 1, got {size}")
        self.size, self.device = size, device


class Box(Thing):
    name = "box"
    examples = ({}, {"size": 3})
    spec_aliases: ClassVar[dict[str, str]] = {"s": "size"}


class Ball(Thing):
    name = "ball"


def _registry(**kwargs: Any) -> Registry[type[Thing]]:
    registry: Registry[type[Thing]] = Registry(
        "thing",
        argument="thing",
        base=Thing,
        aliases={"cube": "box"},
        case_insensitive=True,
        factory_kwargs=("device",),
        examples=True,
        **kwargs,
    )
    registry.register(Box)
    registry.register(Ball)
    return registry


def test_a_registry_is_a_read_only_mapping_of_names_in_order() -> None:
    things = _registry()
    assert list(things) == ["box", "ball"] and len(things) == 2
    assert "box" in things and "cube" not in things and 3 not in things
    assert things["box"] is Box and things.lookup(" CUBE ") is Box  # alias, case, spaces
    assert list(things.items()) == [("box", Box), ("ball", Ball)]
    assert list(things.values()) == [Box, Ball] and things == {"box": Box, "ball": Ball}
    assert things.get("box") is Box and things.get("cube") is None and things.get(3, 0) == 0
    with pytest.raises(TypeError, match=r"\.register\(cls\)"):
        things["box"] = Ball
    assert things.unregister("box") is Box and list(things) == ["ball"]


@pytest.mark.parametrize(
    ("cls", "error", "message"),
    [
        (int, TypeError, r"thing: expected a subclass of \S*Thing, got <class 'int'>"),
        (type("NoName", (Thing,), {}), ValueError, "expected a name such as 'parity'"),
        (type("Spaced", (Thing,), {"name": "a b"}), ValueError, "got 'a b'"),
        (type("Upper", (Thing,), {"name": "Big"}), ValueError, "expected a lower-case name"),
        (type("Other", (Thing,), {"name": "box"}), ValueError, "'box' is already registered"),
        (type("Alias", (Thing,), {"name": "cube"}), ValueError, "an alias of 'box'"),
        (
            type("NoExamples", (Thing,), {"name": "x", "examples": ()}),
            ValueError,
            "expected examples, a tuple of parameter dicts",
        ),
        (
            type("BadExample", (Thing,), {"name": "x", "examples": ({"colour": 1},)}),
            ValueError,
            r"has parameter\(s\) \['colour'\] that its constructor does not take",
        ),
    ],
)
def test_registration_checks_the_entry_once(cls: object, error: type, message: str) -> None:
    things = _registry()
    with pytest.raises(error, match=message) as info:
        things.register(cls)  # type: ignore[arg-type]
    assert info.value.argument == "thing"  # type: ignore[attr-defined]
    assert list(things) == ["box", "ball"]  # nothing was added


def test_replace_and_checks_added_later_run_on_every_entry() -> None:
    things = _registry()
    other = type("Other", (Thing,), {"name": "box"})
    assert things.register(other, replace=True) is other and things["box"] is other
    seen: list[str] = []

    def no_b(cls: type[Thing]) -> None:
        seen.append(cls.name)
        if cls.name.startswith("b"):
            raise ValueError(f"thing: {cls.name!r} starts with b")

    with pytest.raises(ValueError, match="'box' starts with b"):
        things.add_check(no_b)  # the registered entries are checked at once
    things.unregister("box")
    things.unregister("ball")
    things.add_check(no_b)
    with pytest.raises(ValueError, match="'bat' starts with b"):
        things.register(type("Bat", (Thing,), {"name": "bat"}))  # and every later one
    assert seen == ["box", "bat"]


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("bxo", "unknown thing 'bxo' (did you mean 'box'?); expected one of ['ball', 'box']"),
        ("cub", "(did you mean 'cube'?)"),
        ("zzz", "(aliases: ['cube'])"),
    ],
)
def test_an_unknown_name_lists_the_names_and_suggests(name: str, message: str) -> None:
    with pytest.raises(ValueError) as info:
        _registry().lookup(name)
    assert str(info.value).startswith("thing: unknown thing") and message in str(info.value)


def test_without_aliases_the_message_is_check_choices() -> None:
    plain: Registry[type[Thing]] = Registry("thing", argument="kind", base=Thing)
    plain.register(Box)
    with pytest.raises(ValueError, match=r"^kind: expected one of \['box'\], got 'bo' in 'x'"):
        plain.lookup("bo", context=" in 'x'")
    with pytest.raises(TypeError, match=r"^kind: expected a thing name, got int"):
        plain.lookup(3)


def test_resolve_spec_strings_keywords_aliases_and_instances() -> None:
    things = _registry()
    box = things.resolve("box[s=4]", device="meta")
    assert (type(box), box.size, box.device) == (Box, 4, "meta")
    assert things.resolve("cube", size=2).size == 2
    assert things.resolve(box) is box
    with pytest.raises(TypeError, match=r"^kwargs: a thing instance was given"):
        things.resolve(box, size=3)
    with pytest.raises(ValueError, match=r"^thing: box: unknown parameter\(s\) \['colour'\]"):
        things.resolve("box[colour=red]")
    with pytest.raises(TypeError, match=r"^box: unknown parameter\(s\) \['colour'\]"):
        things.resolve("box", colour="red")
    with pytest.raises(ValueError, match=r"^thing: expected one of 's' and 'size'"):
        things.resolve("box[s=1,size=2]")
    with pytest.raises(TypeError, match=r"^box: \['size'\] given both"):
        things.resolve("box[size=1]", size=2)
    with pytest.raises(ValueError, match=r"^thing: in 'box\[size=0\]': size: expected >= 1"):
        things.resolve("box[size=0]")  # the class's refusal, with the spec it came from
    with pytest.raises(ValueError, match=r"^size: expected >= 1"):
        things.resolve("box", size=0)  # keyword arguments: the class's own error
    with pytest.raises(ValueError, match=r"^thing: unknown parameter|^thing: box: unknown"):
        things.resolve("box[device=cpu]")  # a factory keyword is not a spec parameter
    with pytest.raises(TypeError, match=r"^thing: expected a thing name or spec string"):
        things.resolve(1.5)


def test_the_library_axes_are_registries_that_resolve_their_examples() -> None:
    assert isinstance(OPERATORS, Registry) and isinstance(GRAPHS, Registry)
    for name, cls in OPERATORS.items():
        for example in cls.examples:
            spec = format_entry(name, example)
            assert type(resolve_operator(spec)) is cls
            assert type(OPERATORS.resolve(name, **example)) is cls
    for name, cls in GRAPHS.items():
        for example in cls.examples:
            builder = resolve_graph(format_entry(name, example, sep=","))
            assert type(builder) is cls and resolve_graph(builder.spec).spec == builder.spec
    assert isinstance(resolve_graph("softmax"), GraphBuilder)
