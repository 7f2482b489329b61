"""The docstring of each field of a config dataclass, read from its source.

A field's docstring is the string literal right after it, as PEP 257 calls an
attribute docstring::

    @dataclass
    class Config:
        lr: float = 3e-4
        \"\"\"Adam learning rate.\"\"\"

Python keeps no such string at run time, so :func:`field_docs` parses the
source of the class and of each class it inherits from.

Examples:
    >>> from corral.algos.base import AlgoConfig
    >>> field_docs(AlgoConfig)["gamma"]
    'Discount per decision of an agent.'
"""

from __future__ import annotations

import ast
import functools
import inspect
import itertools
import textwrap


@functools.cache
def field_docs(cls: type) -> dict[str, str]:
    """The docstring of each field of ``cls`` that has one (its fields inherited too; a
    subclass's docstring wins over its base's), cleaned as :func:`inspect.cleandoc` does.

    A class whose source cannot be read (one built at run time) gives its fields none.
    """
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if klass is not object:
            docs.update(_own_field_docs(klass))
    return docs


def _own_field_docs(cls: type) -> dict[str, str]:
    """The docstrings of the fields that ``cls``'s own body annotates."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):  # no source: defined at run time, or a built-in
        return {}
    tree = ast.parse(textwrap.dedent(source))
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef)).body
    docs = {}
    for statement, following in itertools.pairwise(body):
        if (
            isinstance(statement, ast.AnnAssign)
            and isinstance(statement.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[statement.target.id] = inspect.cleandoc(following.value.value)
    return docs
