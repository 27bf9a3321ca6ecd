"""Identity from content (issue 45, item 1): every key covers everything the loader read, includes
and the files a suite points at, never the top file's bytes alone.

Before, ``Catalog.recipe_hash`` and the plan's gates and target hashes took the top YAML file's
bytes: an edit to an ``include:``d file changed neither the build key nor the gate's cache key,
and ``load_gates``'s per-process cache served the old floors; a domain suite's items file was in
no key at all.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from quantgate.config.gates import load_gates
from quantgate.config.targets import Catalog
from quantgate.evaluate.suites import load_suite

pytestmark = pytest.mark.unit


@pytest.fixture
def project(tmp_path, repo_root) -> Path:
    for part in ("targets", "recipes", "calibration_sets", "eval_suites"):
        shutil.copytree(repo_root / part, tmp_path / part)
    shutil.copy(repo_root / "gates.yaml", tmp_path / "gates.yaml")
    return tmp_path


def _split_recipe(project: Path) -> Path:
    """fp8-dynamic.yaml with its calibration block moved into an included file."""
    path = project / "recipes" / "fp8-dynamic.yaml"
    lines = path.read_text().splitlines()
    calibration = next(line for line in lines if line.startswith("calibration:"))
    path.write_text(
        "include: [fp8-common.yaml]\n" + "\n".join(line for line in lines if line != calibration) + "\n"
    )
    common = project / "recipes" / "fp8-common.yaml"
    common.write_text(calibration + "\n")
    return common


def test_an_edit_to_an_included_recipe_file_is_a_new_build_key(project):
    catalog = Catalog(project)
    before = catalog.recipe_hash("fp8-dynamic")
    common = _split_recipe(project)
    assert catalog.recipe_hash("fp8-dynamic") == before  # the same content, split in two files
    common.write_text(common.read_text().replace("num_samples: 16", "num_samples: 32"))
    assert catalog.recipe_hash("fp8-dynamic") != before


def test_a_comment_or_key_order_is_not_a_new_build_key(project):
    catalog = Catalog(project)
    before = catalog.recipe_hash("fp8-dynamic")
    path = project / "recipes" / "fp8-dynamic.yaml"
    path.write_text("# reviewed 2026-12-05\n" + path.read_text())
    assert catalog.recipe_hash("fp8-dynamic") == before


def test_load_gates_sees_an_edit_to_an_included_tenants_file_in_the_same_process(project):
    gates = project / "gates.yaml"
    text = gates.read_text()
    head, tenants = text.split("\ntenants:", 1)
    (project / "tenants.yaml").write_text("tenants:" + tenants)
    gates.write_text("include: [tenants.yaml]\n" + head + "\n")
    catalog = Catalog(project)
    first = load_gates(gates, catalog)
    text = (project / "tenants.yaml").read_text()
    edited = re.sub(
        r"(min|max)(_[a-z_]+)?: ([0-9.]+)", lambda m: f"{m[1]}{m[2] or ''}: {float(m[3]) / 2}", text, count=1
    )
    assert edited != text
    (project / "tenants.yaml").write_text(edited)
    again = load_gates(gates, catalog)
    assert again is not first and again.model_dump() != first.model_dump()


def test_a_domain_suites_items_file_is_part_of_its_identity(project):
    path = project / "eval_suites" / "support-domain.yaml"
    first = load_suite(path).spec_hash
    assert load_suite(path).spec_hash == first
    items = project / "eval_suites" / "domain" / "support.jsonl"
    items.write_text(items.read_text() + '{"prompt": "One more?", "reference": "yes"}\n')
    assert load_suite(path).spec_hash != first


def test_the_traffic_suites_identity_covers_the_traffic_it_samples(project):
    path = project / "eval_suites" / "traffic.yaml"
    first = load_suite(path).spec_hash
    log = project / "calibration_sets" / "traffic" / "default-traffic.jsonl"
    with log.open("a") as out:
        out.write('{"id": "extra-1", "class": "chat", "text": "One more prompt from production."}\n')
    assert load_suite(path).spec_hash != first
