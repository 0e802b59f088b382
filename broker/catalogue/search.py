"""The `search_tools` index: BM25 over each tool's name, description and parameters.

A tool's words are its final name split on `_` (counted twice: a name says
most in fewest words), its description, and each parameter's name and
description (nested objects' too). Words are lowercase runs of letters and
digits with a plural `s`/`ies` folded, so "forecasts" finds "forecast".

The index is built once (per agent, per deployment load); each term keeps
its postings with the BM25 term weight already computed, so a query costs
one pass over the postings of its words. Ranking is deterministic: by score,
ties in list order (the order of all tools).
"""

from __future__ import annotations

import difflib
import heapq
import math
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

__all__ = ["SearchIndex", "tool_words", "words"]

_WORD = re.compile(r"[a-z0-9]+")
#: BM25's usual constants: term-frequency saturation and length normalisation.
_K1 = 1.2
_B = 0.75
#: Name words count this many times.
_NAME_WEIGHT = 2
#: How deep parameters' nested `properties` are read.
_PARAMETER_DEPTH = 4


def _fold(word: str) -> str:
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith("ss"):
        return word[:-1]
    return word


def words(text: str) -> list[str]:
    """The index terms of `text`, in order."""
    return [_fold(w) for w in _WORD.findall(text.lower())]


def _parameter_texts(schema: Any, depth: int = 0) -> Iterator[str]:
    if depth > _PARAMETER_DEPTH or not isinstance(schema, Mapping):
        return
    properties = schema.get("properties")
    if isinstance(properties, Mapping):
        for name, value in properties.items():
            yield str(name)
            if isinstance(value, Mapping):
                description = value.get("description")
                if isinstance(description, str):
                    yield description
                yield from _parameter_texts(value, depth + 1)
    items = schema.get("items")
    if isinstance(items, Mapping):
        yield from _parameter_texts(items, depth + 1)


def tool_words(name: str, description: str, parameters: Mapping[str, Any]) -> list[str]:
    """Every term of one tool, name terms repeated `_NAME_WEIGHT` times."""
    terms = words(name.replace("_", " ")) * _NAME_WEIGHT + words(description)
    for text in _parameter_texts(parameters):
        terms += words(text.replace("_", " "))
    return terms


class SearchIndex:
    """BM25 over documents given as term lists, in list order (position = tie-break)."""

    def __init__(self, documents: Sequence[Sequence[str]]) -> None:
        count = len(documents)
        average = sum(len(d) for d in documents) / count if count else 0.0
        frequencies: dict[str, dict[int, int]] = {}
        for position, terms in enumerate(documents):
            for term in terms:
                seen = frequencies.setdefault(term, {})
                seen[position] = seen.get(position, 0) + 1
        lengths = [len(d) for d in documents]
        #: term -> (document positions, idf x BM25 term weight of each).
        self._postings: dict[str, tuple[tuple[int, ...], tuple[float, ...]]] = {}
        for term, docs in frequencies.items():
            idf = math.log(1 + (count - len(docs) + 0.5) / (len(docs) + 0.5))
            positions = tuple(docs)
            weights = tuple(
                idf * tf * (_K1 + 1) / (tf + _K1 * (1 - _B + _B * lengths[p] / average))
                for p, tf in docs.items()
            )
            self._postings[term] = (positions, weights)
        self._vocabulary: list[str] | None = None

    def __len__(self) -> int:
        return len(self._postings)

    def search(self, query: str, limit: int) -> list[int]:
        """The positions of the best `limit` documents for `query`, best first."""
        scores: dict[int, float] = {}
        get = scores.get
        for term in dict.fromkeys(words(query)):
            found = self._postings.get(term)
            if found is None:
                continue
            for position, weight in zip(*found, strict=True):
                scores[position] = get(position, 0.0) + weight
        if not scores:
            return []
        return heapq.nsmallest(limit, scores, key=lambda p: (-scores[p], p))

    def suggest(self, query: str, *, at_most: int = 5) -> list[str]:
        """Indexed words close to the query's words that the index does not hold."""
        if self._vocabulary is None:
            self._vocabulary = sorted(self._postings)
        found: list[str] = []
        for term in dict.fromkeys(words(query)):
            if term in self._postings:
                continue
            for close in difflib.get_close_matches(term, self._vocabulary, n=3, cutoff=0.75):
                if close not in found:
                    found.append(close)
        return found[:at_most]
