"""A catalog file: validated, and every error names the file, the line and the field."""

import pytest

from llmgw.ctl.catalog_file import CatalogError, load


def write(tmp_path, text):
    p = tmp_path / "catalog.yaml"
    p.write_text(text)
    return p


def test_a_good_catalog_loads_with_defaults(tmp_path):
    (m,) = load(write(tmp_path, "models:\n  - name: m\n    profiles:\n      - name: p\n        gpus: 2\n"))
    assert m.name == "m" and m.min_replicas == 1 and m.profiles[0].gpus == 2 and m.profiles[0].nodes == 1


@pytest.mark.parametrize(
    "text, expected",
    [
        ("models:\n  - name: m\n    profiles:\n      - name: p\n        gpus: -1\n", ":5: models.0.profiles.0.gpus: Input should be greater than or equal to 0"),
        ("models:\n  - name: m\n    profiles: []\n", ":3: models.0.profiles: List should have at least 1 item"),
        ("models:\n  - name: m\n    replicas: 2\n    profiles: [{name: p}]\n", ":3: models.0.replicas: Extra inputs are not permitted"),
        ("models:\n  - name: 'bad name'\n    profiles: [{name: p}]\n", ":2: models.0.name"),
        ("models:\n  - profiles: [{name: p}]\n", ":2: models.0.name: Field required"),
        ("models:\n  - name: m\n    profiles: [{name: p}, {name: p}]\n", "two profiles have the same name"),
        ("models: [\n", "not valid YAML"),
    ],
)
def test_errors_name_the_line_and_the_field(tmp_path, text, expected):
    path = write(tmp_path, text)
    with pytest.raises(CatalogError) as e:
        load(path)
    assert str(path) in str(e.value)
    assert expected in str(e.value)


def test_a_model_defined_twice_is_refused(tmp_path):
    with pytest.raises(CatalogError, match="defined twice"):
        load(write(tmp_path, "models:\n  - {name: m, profiles: [{name: p}]}\n  - {name: m, profiles: [{name: p}]}\n"))


def test_a_missing_file_says_so(tmp_path):
    with pytest.raises(CatalogError, match="No such file"):
        load(tmp_path / "nope.yaml")
