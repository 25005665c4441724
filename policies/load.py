"""Load policy YAML into validated objects, reporting every problem with file, rule and fix.

Each YAML document has ``version: 1`` and ``kind: upstream``, ``destination``, ``runtime``,
``alerts`` or ``enterprise`` (the deny list and approver groups, ``policies/enterprise_doc.py``).
A directory is
read recursively (``*.yaml``/``*.yml``, several documents per file allowed). Unknown keys are
errors. Nothing half-valid is returned: any error raises ``PolicyLoadError`` listing all of them.
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType
from typing import Any

import yaml

import policies.destination_doc as destination_doc
import policies.enterprise_doc as enterprise_doc
import policies.runtime_doc as runtime_doc
import policies.unlisted_doc as unlisted_doc
import policies.upstream_doc as upstream_doc
from policies.alerts_doc import alerts
from policies.model import POLICY_VERSION, Alerting, Destination, Enterprise, PolicySet, Runtime, Upstream
from policies.report import Problem, Report

SHIPPED_POLICY_DIR = Path(__file__).resolve().parent


class PolicyLoadError(ValueError):
    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        super().__init__("\n".join(str(p) for p in problems))


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate mapping keys instead of keeping the last one."""


def _construct_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    mapping: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node)
        try:
            duplicate = key in mapping
        except TypeError as exc:  # a list or mapping used as a key: `? [a, b]`
            raise yaml.constructor.ConstructorError(
                None, None, f"unhashable key ({exc})", key_node.start_mark
            ) from exc
        if duplicate:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        mapping[key] = loader.construct_object(value_node)
    return mapping


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _construct_mapping,
)


def policy_files(directory: Path) -> list[Path]:
    """YAML files under ``directory``, skipping hidden files and directories (a Kubernetes
    ConfigMap volume keeps a second copy of every file under ``..<timestamp>/``)."""
    return sorted(
        p for p in directory.rglob("*")
        if p.suffix in (".yaml", ".yml") and p.is_file()
        and not any(part.startswith(".") for part in p.relative_to(directory).parts)
    )


def load_policy_dir(directory: str | Path) -> PolicySet:
    """Load and validate every policy document under ``directory``."""
    root = Path(directory)
    if not root.is_dir():
        raise PolicyLoadError(
            [Problem(str(root), "policy dir", "is not a directory", "point to a policy directory")]
        )
    return load_policy_files(policy_files(root))


def load_policy_files(files: list[Path]) -> PolicySet:
    problems: list[Problem] = []
    upstreams: dict[str, Upstream] = {}
    runtimes: dict[str, Runtime] = {}
    destinations: dict[str, Destination] = {}
    alerting: list[Alerting] = []
    enterprises: list[Enterprise] = []
    for path in files:
        for index, doc in _documents(path, problems):
            report = Report(str(path), problems)
            kind = doc.get("kind") if isinstance(doc, dict) else None
            where = f"document {index + 1}"
            if not isinstance(doc, dict):
                report.add(where, "is not a mapping", "write `version: 1` and `kind: ...` keys")
                continue
            if not _version_ok(doc, where, report):
                continue
            if kind == "upstream":
                upstream = upstream_doc.upstream(doc, report)
                if upstream is not None:
                    _add_unique(upstreams, upstream.name, upstream, "upstream", report)
            elif kind == "destination":
                found_dest = destination_doc.destination(doc, report)
                if found_dest is not None:
                    _add_unique(destinations, found_dest.name, found_dest, "destination", report)
            elif kind == "runtime":
                runtime = runtime_doc.runtime(doc, report)
                if runtime is not None:
                    _add_unique(runtimes, runtime.name, runtime, "runtime", report)
            elif kind == "alerts":
                found = alerts(doc, report)
                if found is not None and alerting:
                    report.add("alerts", f"a second alerts document (first in {alerting[0].source})",
                               "keep one alerts document per policy directory")
                elif found is not None:
                    alerting.append(found)
            elif kind == "enterprise":
                ent = enterprise_doc.enterprise(doc, report)
                if ent is not None and enterprises:
                    first = enterprises[0].source
                    report.add("enterprise", f"a second enterprise document (first in {first})",
                               "keep one enterprise document (deny list, approvers) per policy directory")
                elif ent is not None:
                    enterprises.append(ent)
            else:
                report.add(
                    f"{where} kind", f"kind is {kind!r}",
                    "set `kind: upstream`, `kind: destination`, `kind: runtime`, `kind: alerts` or "
                    "`kind: enterprise`",
                )
    ent = enterprises[0] if enterprises else Enterprise()
    if not problems:
        destination_doc.cross_references(upstreams, destinations, problems)
    if not problems:
        runtime_doc.cross_references(upstreams, runtimes, problems, destinations)
        enterprise_doc.cross_references(ent, upstreams, runtimes, problems, destinations)
        unlisted_doc.cross_references(runtimes, upstreams, destinations, ent, problems)
    if problems:
        raise PolicyLoadError(problems)
    return PolicySet(upstreams=MappingProxyType(upstreams), runtimes=MappingProxyType(runtimes),
                     alerting=alerting[0] if alerting else Alerting(),
                     destinations=MappingProxyType(destinations), enterprise=ent)


def _version_ok(doc: dict[Any, Any], where: str, report: Report) -> bool:
    fix = f"set `version: {POLICY_VERSION}`"
    if "version" not in doc:
        report.add(f"{where} version", "missing key 'version'", fix)
        return False
    version = doc["version"]
    # `version: true` and `version: 1.0` compare equal to 1 in Python; only the integer is valid.
    if type(version) is not int or version != POLICY_VERSION:
        report.add(f"{where} version", f"version is {version!r}, expected {POLICY_VERSION}", fix)
        return False
    return True


def _add_unique(
    table: dict[str, Any], name: str, value: Any, kind: str, report: Report
) -> None:
    if name in table:
        report.add(
            f"{kind} {name}",
            f"duplicate {kind} name (also in {table[name].source})",
            "give each policy document a unique name",
        )
    else:
        table[name] = value


def _documents(path: Path, problems: list[Problem]) -> list[tuple[int, Any]]:
    try:
        text = path.read_text(encoding="utf-8")
        docs = list(yaml.load_all(text, Loader=_UniqueKeyLoader))
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(Problem(str(path), "file", f"cannot be read: {exc}", "check the file"))
        return []
    except (yaml.YAMLError, ValueError) as exc:  # ValueError: int() refuses a 5,000-digit number
        problems.append(Problem(str(path), "yaml", _yaml_message(exc), "fix the YAML syntax"))
        return []
    except RecursionError:
        problems.append(
            Problem(str(path), "yaml", "nested too deeply", "flatten the YAML structure")
        )
        return []
    return [(i, d) for i, d in enumerate(docs) if d is not None]


def _yaml_message(exc: Exception) -> str:
    """``line 4, column 1: duplicate key 'name'`` rather than PyYAML's multi-line rendering."""
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        context = f"{exc.context}: " if exc.context else ""
        return f"line {mark.line + 1}, column {mark.column + 1}: {context}{exc.problem}"
    return str(exc).replace("\n", " ")
