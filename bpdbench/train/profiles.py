"""Named training settings: the tables of heads profiles, distillation budgets and drafter profiles, and the objects
a caller may pass in place of a name.

A trainer takes either a name (looked up in its table, as the CLI does) or the settings object itself, used as
given: a variant made with `dataclasses.replace` from a table entry (a test's shorter fit, a smaller dataset) needs
no change to the shared table. Each object carries its `name` (the table sets it from its key, and `replace` keeps
it), because the cache folder and the recorded profile name come from it: a variant of `ci` is saved where `ci` is.
"""
from __future__ import annotations

from dataclasses import asdict, replace
from typing import TypeVar

T = TypeVar("T")


def named(table: dict[str, T]) -> dict[str, T]:
    """The table with every entry's `name` set to its key."""
    return {key: replace(value, name=key) for key, value in table.items()}


def name_of(profile) -> str:
    """The name a profile is saved and recorded under: a name as it is, an object's `name` (which it must have)."""
    if isinstance(profile, str):
        return profile
    if not profile.name:
        raise ValueError(f"a {type(profile).__name__} given as an object needs a name (its cache folder's): "
                         f"replace() a table entry, or set name=")
    return profile.name


def resolve(profile: str | T, table: dict[str, T]) -> T:
    """The table's entry for a name (KeyError for an unknown one; the commands check names first), an object as
    given."""
    if isinstance(profile, str):
        return table[profile]
    name_of(profile)
    return profile


def settings(profile) -> dict:
    """What a record keeps of a profile: its fields without the name (the record names the profile beside them)."""
    return {k: v for k, v in asdict(profile).items() if k != "name"}
