"""Reading config files (YAML or JSON): one home for turning every way a file can be
unreadable into one ValueError line naming the file (and line:column), never a traceback.
Cluster fleet and job files, training configs, experiment records (and the baselines they
name) and the phase controller's budget file all load through here.

Beyond the parsers' own errors, two things a parser lets through are refused here:
- a key repeated in one mapping (YAML) or object (JSON): both parsers keep the last value
  and drop the others silently, so two experiment arms of one name would become one;
- YAML aliases that expand to more than ``MAX_ALIASED_NODES`` nodes, or into themselves: a
  "billion laughs" file loads in milliseconds as shared references, and the first code that
  walks it (a merge, a canonical-JSON hash) blows up (json.dumps of a 477-byte one had not
  finished after 60 s here). The budget is counted while composing, before anything expands.

PyYAML's merge keys (``<<``) are also done here as the spec says (see
``_ConfigLoader.flatten_mapping``).
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

MAX_CONFIG_BYTES = 64 << 20  # a 1000-job stream is ~150 KB
# Nodes that aliases may add to a document when expanded. A shared block of 20 nodes merged
# into each of 1000 jobs is 20,000; the classic 9x9 "lol" bomb passes 100,000 at its 6th level.
MAX_ALIASED_NODES = 100_000
_MERGE_TAGS = {"tag:yaml.org,2002:merge", "tag:yaml.org,2002:value"}


def load_structured(path: str | Path) -> Any:
    """Read a YAML or JSON file (by suffix; YAML is a superset of JSON anyway).

    Every way the file can be unreadable becomes one ValueError line naming the file (and
    the line and column, when the parser knows them), never a traceback: a key repeated in
    one mapping and an alias bomb included (see the module docstring).
    """
    path = Path(path)
    size = path.stat().st_size
    if size > MAX_CONFIG_BYTES:
        raise ValueError(f"{path}: {size} bytes is more than the limit of {MAX_CONFIG_BYTES}")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"{path}: not UTF-8 text (byte {err.start})") from None
    try:
        if path.suffix == ".json":
            return _load_json(text)
        return yaml.load(text, Loader=_ConfigLoader)  # noqa: S506 (a SafeLoader subclass)
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}:{err.lineno}:{err.colno}: invalid JSON: {err.msg}") from None
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        at = f":{mark.line + 1}:{mark.column + 1}" if mark is not None else ""
        problem = " ".join(str(err.problem or err.context or "syntax error").split())
        raise ValueError(f"{path}{at}: invalid YAML: {problem}") from None
    except yaml.YAMLError as err:
        raise ValueError(f"{path}: invalid YAML: {' '.join(str(err).split())[:200]}") from None
    except RecursionError:
        raise ValueError(f"{path}: nested too deeply to be a config file") from None


def _shown(key: Any) -> str:
    return repr(key) if len(repr(key)) <= 80 else repr(key)[:77] + "..."


class _ConfigLoader(yaml.SafeLoader):
    """SafeLoader that refuses repeated keys and bounds what aliases expand to, both while
    composing: duplicates are seen before merge keys (``<<``) fold other mappings in, and
    alias sizes before any walk expands them."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._expanded: dict[int, int] = {}  # id(node) -> its size with every alias expanded
        self._aliased_nodes = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        alias = self.peek_event() if self.check_event(yaml.AliasEvent) else None
        node = super().compose_node(parent, index)
        if node is None:
            return None
        if alias is not None:
            return self._count_alias(node, alias)
        self._expanded[id(node)] = 1 + sum(self._expanded[id(child)] for child in _children(node))
        return node

    def _count_alias(self, node: Node, event: Any) -> Node:
        size = self._expanded.get(id(node))
        if size is None:  # its anchor is still being composed: the alias sits inside it
            raise ComposerError(None, None, f"alias *{event.anchor} refers to a node that contains it", event.start_mark)
        self._aliased_nodes += size
        if self._aliased_nodes > MAX_ALIASED_NODES:
            raise ComposerError(
                None,
                None,
                f"aliases expand to more than {MAX_ALIASED_NODES} nodes "
                f"(at *{event.anchor}); a config file never needs that many",
                event.start_mark,
            )
        return node

    def compose_mapping_node(self, anchor: Any) -> MappingNode:
        node = super().compose_mapping_node(anchor)
        first: dict[Any, ScalarNode] = {}
        for key_node, _ in node.value:
            if not isinstance(key_node, ScalarNode) or key_node.tag in _MERGE_TAGS:
                continue  # non-scalar keys are refused as unhashable when constructed
            key = self.construct_object(key_node, deep=True)
            if key in first:
                raise ConstructorError(
                    None,
                    None,
                    f"duplicate key {_shown(key)} (first at line {first[key].start_mark.line + 1}); "
                    "YAML would keep only the last one",
                    key_node.start_mark,
                )
            first[key] = key_node
        return node

    def flatten_mapping(self, node: MappingNode) -> None:
        """Merge keys (``<<``) as https://yaml.org/type/merge.html says: the mapping's own keys
        override merged ones, and an earlier source in ``<<: [*a, *b]`` overrides a later one.
        PyYAML 6.0.4 dedups merged keys by id() of the key string, so its answer depends on
        string interning: the later source wins for keys of two or more characters
        (yaml/pyyaml#953), and a one-character key that a merged mapping overrode reverts to
        the value it overrode when that mapping is merged again."""
        sources: list[list[tuple[Node, Node]]] = []
        own = []
        for key_node, value_node in node.value:
            if key_node.tag != "tag:yaml.org,2002:merge":
                if key_node.tag == "tag:yaml.org,2002:value":
                    key_node.tag = "tag:yaml.org,2002:str"
                own.append((key_node, value_node))
                continue
            for source in value_node.value if isinstance(value_node, SequenceNode) else [value_node]:
                if not isinstance(source, MappingNode):
                    raise ConstructorError(
                        "while constructing a mapping",
                        node.start_mark,
                        f"expected a mapping or list of mappings for merging, but found {source.id}",
                        source.start_mark,
                    )
                self.flatten_mapping(source)
                sources.append(source.value)
        # Construction keeps the last pair of each key: later sources first, the mapping's own keys last.
        # The list is no longer than the aliases' expansion, which compose_node has bounded.
        node.value = [pair for pairs in reversed(sources) for pair in pairs] + own


def _children(node: Node) -> Iterator[Node]:
    if isinstance(node, SequenceNode):
        yield from node.value
    elif isinstance(node, MappingNode):
        for key_node, value_node in node.value:
            yield key_node
            yield value_node


class _DuplicateKey(Exception):
    """A JSON object repeats ``key``; ``offset`` is where, once the key walk has found it."""

    def __init__(self, key: str, offset: int = 0) -> None:
        super().__init__(key)
        self.key, self.offset = key, offset


def _refuse_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    data = dict(pairs)
    if len(data) != len(pairs):
        raise _DuplicateKey(next(key for key, count in Counter(key for key, _ in pairs).items() if count > 1))
    return data


def _load_json(text: str) -> Any:
    try:
        return json.loads(text, object_pairs_hook=_refuse_duplicates)
    except _DuplicateKey as dup:
        where = _first_json_duplicate(text) or dup  # the walk finds it: this offset 0 is never shown in practice
        raise json.JSONDecodeError(
            f"duplicate key {_shown(where.key)}; JSON parsers keep only the last one", text, where.offset
        ) from None


_JSON_SPACE = re.compile(r"[ \t\n\r]*")


def _first_json_duplicate(text: str) -> _DuplicateKey | None:
    """The first key repeated within one object, walking the text in order (raw_decode reads each
    key and scalar). Only on the error path: json's pairs hook is never told where a key was, and
    the text up to that key has parsed once already."""
    decoder = json.JSONDecoder()

    def skip(at: int) -> int:
        space = _JSON_SPACE.match(text, at)
        return space.end() if space else at

    def past_value(at: int) -> int:
        at = skip(at)
        if text[at] not in "{[":
            return decoder.raw_decode(text, at)[1]
        closing, seen, at = "}" if text[at] == "{" else "]", set(), skip(at + 1)
        while text[at] != closing:
            if closing == "}":
                key, end = decoder.raw_decode(text, at)
                if key in seen:
                    raise _DuplicateKey(key, at)
                seen.add(key)
                at = skip(end) + 1  # past the ':'
            at = skip(past_value(at))
            at = skip(at + 1) if text[at] == "," else at
        return at + 1

    try:
        past_value(0)
    except _DuplicateKey as found:
        return found
    return None
