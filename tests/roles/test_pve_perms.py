"""The Proxmox API double's per-endpoint permission table (tests/doubles/pve_api_schema.py PERMS) is the
real API schema's: each `permissions.check` in the Proxmox VE API schema (tests/roles/pve_schema.py),
for every route the double serves. Endpoints the schema marks `user: all` must not be in the table (they
check in code)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from pve_schema import APIDATA

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "doubles"))
from pve_api_schema import PERMS, ROUTES


def _schema_permissions() -> dict[tuple[str, str], dict]:
    out: dict[tuple[str, str], dict] = {}

    def walk(node: dict) -> None:
        for method, info in node.get("info", {}).items():
            out[(method, node["path"])] = info.get("permissions") or {}
        for child in node.get("children", []):
            walk(child)

    for root in json.loads(APIDATA.read_text()):
        walk(root)
    return out


SAMPLE = {"node": "pve1", "storage": "local", "vmid": "200", "upid": "UPID:pve1:1:2:3:vzstart:200:root@pam:"}


@pytest.mark.skipif(not APIDATA.exists(), reason=f"{APIDATA} is not present")
def test_perms_table_is_the_schemas() -> None:
    schema = _schema_permissions()
    for method, pattern, name in ROUTES:
        hits = [
            perms
            for (m, path), perms in schema.items()
            if m == method
            and re.fullmatch(pattern, re.sub(r"\{(\w+)\}", lambda g: SAMPLE.get(g.group(1), "x1"), path))
        ]
        assert hits, f"{method} {pattern} ({name}) is not in the schema"
        if "check" in hits[0]:
            assert PERMS.get(name) == hits[0]["check"], (
                f"{name}: {PERMS.get(name)} vs schema {hits[0]['check']}"
            )
        else:
            assert name not in PERMS, (
                f"{name}: the schema has no check ({hits[0]}); the double must not add one"
            )
