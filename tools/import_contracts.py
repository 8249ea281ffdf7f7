"""A custom import-linter contract: no module imports another module's private names.

`from dynshape.x.y import _helper` couples the importer to what the other module is free to change; when two
modules need the same helper it belongs, public, in one of them (or a third). import-linter's own contracts
check modules, not names, so this one reads the sources: every `from M import name` inside the root package
where `name` starts with one underscore (dunders are public) and M is another module. Relative imports are
resolved first. Configure it in pyproject.toml:

    [tool.importlinter]
    contract_types = ["private_names: import_contracts.PrivateNamesContract"]

and run `lint-imports` with this directory on PYTHONPATH (`.ci/run` does).
"""

from __future__ import annotations

import ast
import importlib.util

from importlinter.application import output
from importlinter.domain import fields
from importlinter.domain.contract import Contract, ContractCheck


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _resolve(importer: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    parts = importer.split(".")
    base = parts if is_package else parts[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


class PrivateNamesContract(Contract):
    type_name = "private_names"
    containers = fields.SetField(subfield=fields.StringField())

    def check(self, graph, verbose: bool) -> ContractCheck:  # noqa: ANN001 - grimp's ImportGraph
        broken = []
        for root in sorted(self.containers):
            for module in sorted(m for m in graph.modules if m == root or m.startswith(root + ".")):
                spec = importlib.util.find_spec(module)
                if spec is None or not spec.origin or not spec.origin.endswith(".py"):
                    continue
                is_package = spec.submodule_search_locations is not None
                with open(spec.origin, encoding="utf-8") as f:
                    tree = ast.parse(f.read(), spec.origin)
                for node in ast.walk(tree):
                    if not isinstance(node, ast.ImportFrom):
                        continue
                    source = _resolve(module, is_package, node)
                    if not (source == root or source.startswith(root + ".")) or source == module:
                        continue
                    for alias in node.names:
                        if _private(alias.name) and f"{source}.{alias.name}" not in graph.modules:
                            broken.append(f"{module}:{node.lineno} imports {alias.name} from {source}")
        return ContractCheck(kept=not broken, metadata={"broken": broken})

    def render_broken_contract(self, check: ContractCheck) -> None:
        for line in check.metadata["broken"]:
            output.print_error(f"- {line}")
            output.new_line()
