"""One idiom for every plug-in of the house: a `Registry` of named parts that a room lends to another.

The run's hooks (`drive.hooks`: what the modes lend the run), the report's sections (`report.registry`), the
bench backends (`bench.backend`) and the campaign checks that a section's owner adds (`campaign.checks`) are
each one `Registry`: registered by name where the part lives (a decorator, or a call when its package is
imported), looked up by name where it is used, and a name nobody registered is a `LookupError` that says what
was asked, what is known and where it would come from. The campaign schema reads its backend names from here.
The hooks of the run and of the plan are `Lenders`: registries of loaders, each part imported when first asked for
and kept.

May import: nothing of raysweep.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar

__all__ = ["Lenders", "Registry"]

T = TypeVar("T")


class Registry(Generic[T]):
    """Parts of one kind by name (`what` names the kind in messages; `hint` says where they come from)."""

    def __init__(self, what: str, hint: str = "") -> None:
        self.what = what
        self.hint = hint
        self._items: dict[str, T] = {}

    def register(self, name: str, item: T) -> T:
        """Lend `item` as `name` (a second registration of a name replaces the first); returns the item."""
        self._items[name] = item
        return item

    def add(self, name: str) -> Callable[[T], T]:
        """`register` as a decorator: `@BACKENDS.add("native")`."""
        def add(item: T) -> T:
            return self.register(name, item)
        return add

    def get(self, name: str) -> T:
        """The part registered as `name`; a `LookupError` naming it, the known names and the hint if none is."""
        if name not in self._items:
            known = ", ".join(f"`{n}`" for n in self.names()) or "none"
            hint = f": {self.hint}" if self.hint else ""
            raise LookupError(f"no {self.what} `{name}` is registered (known: {known}){hint}")
        return self._items[name]

    def names(self) -> list[str]:
        """The registered names, in the order they were registered."""
        return list(self._items)

    def values(self) -> list[T]:
        return list(self._items.values())

    def __contains__(self, name: object) -> bool:
        return name in self._items

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


class Lenders(Registry[Callable[[], object]]):
    """Loaders of parts one room lends another (the run's hooks, the plan's): each registered as a loader that
    imports the part when it is first asked for, so that registering costs nothing; `part` loads it once and
    keeps it, and a second registration of a name loads anew."""

    def __init__(self, what: str, hint: str = "") -> None:
        super().__init__(what, hint)
        self._loaded: dict[str, object] = {}

    def register(self, name: str, item: Callable[[], object]) -> Callable[[], object]:
        self._loaded.pop(name, None)
        return super().register(name, item)

    def part(self, name: str) -> object:
        """The part lent as `name`, loaded on first use; a `LookupError` as `get` raises if nobody lent it."""
        if name not in self._loaded:
            self._loaded[name] = self.get(name)()
        return self._loaded[name]
