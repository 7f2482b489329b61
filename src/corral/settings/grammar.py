"""The grammar of ``--set key=value``, the same on every command (check, play, train).

A value reads as it would in YAML, with Python's spellings too:

* ``true``, ``false`` (any case) are booleans; ``null``, ``None`` (any case) and ``~`` are
  ``None``;
* ``3``, ``-2``, ``1_000`` are ints; ``0.5``, ``1e-3``, ``2e6`` are floats;
* ``[1, 2]`` is a list, ``(1, 2)`` and ``1,2`` are tuples, ``{a: 1}`` is a dict; a bare word
  inside them is a string (``[a, b]``);
* a quoted ``'3'`` or ``"true"`` is the string inside the quotes;
* anything else is the text as typed: ``fast``, ``mpe2/simple_v3``, ``pkg.mod:Policy``,
  ``yes`` (YAML 1.1's ``yes``/``no``/``on``/``off`` are words, as in YAML 1.2).

Nothing is evaluated: the text is parsed, never run. A training setting is then typed by
its field (``corral.training.config``): ``tensorboard=no`` is ``False``, ``hidden=64``
the tuple ``(64,)``.

Examples:
    >>> parse_settings(["flag=false", "x=None", "n=3", "sizes=[1, 2]", "name='3'"])
    {'flag': False, 'x': None, 'n': 3, 'sizes': [1, 2], 'name': '3'}
"""

from __future__ import annotations

import ast
import re
import warnings
from collections.abc import Iterable
from typing import Any

from corral.errors import ConfigError

_WORDS: dict[str, Any] = {"true": True, "false": False, "null": None, "none": None}
_KEY = re.compile(r"[A-Za-z_]\w*(\.\w+)*")


class _NotAValue(Exception):
    """Text that is not a value of the grammar: it stays a string."""


def parse_settings(items: Iterable[str]) -> dict[str, Any]:
    """``["n=3", "env_kwargs.mode=fast"]`` -> ``{"n": 3, "env_kwargs.mode": "fast"}``.

    A key is a name, or ``setting.key`` for one key of a dict setting; a value is read
    by :func:`parse_value`. A later item wins. Raises :class:`ConfigError` naming the
    item that is not ``KEY=VALUE``.
    """
    settings: dict[str, Any] = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep:
            raise ConfigError(f"expected KEY=VALUE, got {item!r}: setting {key!r} has no value")
        if not key:
            raise ConfigError(f"expected KEY=VALUE, got {item!r}: the setting's name is missing")
        if not _KEY.fullmatch(key):
            raise ConfigError(
                f"expected KEY=VALUE with KEY a setting name (letters, digits and _, "
                f"dotted for one key of a dict setting), got {item!r}: {key!r} is not a name"
            )
        settings[key] = parse_value(text)
    return settings


def parse_value(text: str) -> Any:
    """The value that ``text`` spells (see the module's grammar); else ``text`` itself.

    Examples:
        >>> parse_value("false"), parse_value("None"), parse_value("1e-3"), parse_value("a-b")
        (False, None, 0.001, 'a-b')
    """
    stripped = text.strip()
    if stripped == "~":
        return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)  # '\d' in quotes is those 2 chars
            tree = ast.parse(stripped, mode="eval")
        return _value(tree.body, top=True)
    except (SyntaxError, ValueError, RecursionError, _NotAValue):
        return text


def _value(node: ast.expr, top: bool = False) -> Any:
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float, type(None))):
        return node.value  # bool is an int
    if (
        isinstance(node, ast.UnaryOp)
        and isinstance(node.op, (ast.UAdd, ast.USub))
        and isinstance(node.operand, ast.Constant)
        and isinstance(node.operand.value, (int, float))
        and not isinstance(node.operand.value, bool)
    ):
        number = node.operand.value
        return -number if isinstance(node.op, ast.USub) else number
    if isinstance(node, ast.Name):
        word = node.id.lower()
        if word in _WORDS:
            return _WORDS[word]
        if top:
            raise _NotAValue  # a bare word is the text as typed
        return node.id
    if isinstance(node, ast.List):
        return [_value(item) for item in node.elts]
    if isinstance(node, ast.Tuple):
        return tuple(_value(item) for item in node.elts)
    if isinstance(node, ast.Dict):
        keys = [k for k in node.keys if k is not None]  # None: a ``**`` unpacking
        if len(keys) == len(node.keys):
            try:
                return {_value(k): _value(v) for k, v in zip(keys, node.values, strict=True)}
            except TypeError as err:  # an unhashable key
                raise _NotAValue from err
    raise _NotAValue
