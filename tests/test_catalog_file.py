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


def test_api_keys_are_hashed_when_read_and_the_key_itself_goes_nowhere(tmp_path):
    import hashlib

    from llmgw.ctl.catalog_file import load_catalog

    text = (
        "api_keys:\n"
        "  - name: team-a\n    owner: org/team-a\n    key: sk-team-a-0123456789abcdef\n    requests_per_minute: 60\n"
        "  - name: ops\n    owner: org\n    key_sha256: " + "ab" * 32 + "\n"
    )
    catalog = load_catalog(write(tmp_path, text))
    a, ops = catalog.api_keys
    assert a.key_sha256 == hashlib.sha256(b"sk-team-a-0123456789abcdef").hexdigest()
    assert a.requests_per_minute == 60 and ops.key_sha256 == "ab" * 32
    assert "sk-team-a" not in repr(catalog)  # only the hash is kept


@pytest.mark.parametrize(
    "text, expected",
    [
        ("api_keys:\n  - name: k\n    owner: o\n", ":2: api_keys.0: Value error, give the key or its key_sha256"),
        ("api_keys:\n  - name: k\n    owner: o\n    key: short\n", ":4: api_keys.0.key: String should have at least 16"),
        ("api_keys:\n  - {name: k, owner: o, key: 0123456789abcdefg}\n  - {name: k, owner: o, key: 0123456789abcdefg}\n",
         "api key k is defined twice"),
    ],
)
def test_a_bad_api_key_names_its_line_and_field(tmp_path, text, expected):
    from llmgw.ctl.catalog_file import load_catalog

    with pytest.raises(CatalogError) as e:
        load_catalog(write(tmp_path, text))
    assert expected in str(e.value)


def test_a_value_past_the_event_contracts_bounds_is_refused_before_anything_is_published(tmp_path):
    # Issue 35: the fold quarantines an event past the bounds (core/contract/bounds.py); published,
    # `ctl apply` would have said "applied" while nothing changed.
    path = tmp_path / "c.yaml"
    path.write_text("models:\n  - name: m\n    profiles:\n      - name: p\n        gpus: 0\n        cpu_cores: 100000\n")
    with pytest.raises(CatalogError) as e:
        load(path)
    assert str(path) in str(e.value) and "model m" in str(e.value) and "$.model.profiles[0].cpu_cores" in str(e.value)
