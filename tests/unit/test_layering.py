"""Who may import whom, read from the source: the layering DESIGN.md draws.

- sandbox_core knows nothing of the farm (no Celery, no Redis, no producer/worker);
- producer.protocol, the farm contract, imports only sandbox_core, pydantic and redis;
- the worker imports nothing of producer but producer.protocol;
- the producer never imports worker code.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
STDLIB = set(sys.stdlib_module_names)


def imports_of(path: Path) -> list[str]:
    """Absolute module names a file imports (relative imports resolved to its package)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    found: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                found.append(f"{base}.{node.module}" if node.module else base)
            else:
                assert node.module is not None
                found.append(node.module)
    return found


def files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


def top(name: str) -> str:
    return name.split(".")[0]


def violations(package: str, allowed: set[str], exempt: str | None = None) -> list[str]:
    bad = []
    for path in files(package):
        if exempt and str(path.relative_to(ROOT)).startswith(exempt):
            continue
        for name in imports_of(path):
            if top(name) in STDLIB or top(name) == "__future__":
                continue
            if not any(name == rule or name.startswith(rule + ".") for rule in allowed):
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
    return bad


def test_the_rules_see_the_imports() -> None:
    # Positive control: the reader finds imports the rules are about.
    assert "producer.protocol" in imports_of(ROOT / "worker/tasks.py")
    assert "sandbox_core" in imports_of(ROOT / "producer/protocol/scripts.py")
    assert "redis" in imports_of(ROOT / "producer/protocol/connection.py")


def test_sandbox_core_knows_nothing_of_the_farm() -> None:
    assert violations("sandbox_core", {"sandbox_core", "pydantic", "docker"}) == []


def test_the_protocol_imports_only_sandbox_core_pydantic_and_redis() -> None:
    # pydantic_core is pydantic's own (pinned by it): its to_json builds the messages
    allowed = {"producer.protocol", "sandbox_core", "pydantic", "pydantic_settings", "redis"}
    assert violations("producer/protocol", allowed | {"pydantic_core"}) == []


def test_the_worker_imports_only_the_protocol_of_producer() -> None:
    bad = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in files("worker")
        for name in imports_of(path)
        if top(name) == "producer" and not name.startswith("producer.protocol")
    ]
    assert bad == []


def test_the_producer_never_imports_worker_code() -> None:
    bad = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in files("producer")
        for name in imports_of(path)
        if top(name) == "worker"
    ]
    assert bad == []
