"""`ctl get` as kubectl's hands know it (issue 34, part 5), without a bus:
label selectors, kubectl's JSONPath (templates, relaxed paths, escaped
dots), custom columns, --sort-by, the watch's JSON lines from the first,
owners and API keys without hashes, and the argument parsing of them all."""

from __future__ import annotations

import argparse
import json

import pytest

from llmgw.cli.get import apikeys_rows, owners_rows
from llmgw.cli.main import parser
from llmgw.core.contract import events as ev
from llmgw.core.folding.fold import apply
from llmgw.core.folding.state import State
from llmgw.ctl import selectors, views
from llmgw.ctl.jsonpath import JsonPathError, Path, Template, to_jsonpath_ng
from llmgw.ctl.output import Output, Watch, parse_output, render, sort_rows

REPLICAS = [
    {"id": "chat-1", "model": "chat", "state": "ready", "profile": "one", "nodes": ["gpu-1"], "placed_at": 30.0,
     "restart": "", "fingerprint": "f1", "labels": {"llmgw.io/rack": "r1"}},
    {"id": "chat-2", "model": "chat", "state": "loading", "profile": "one", "nodes": ["gpu-2"], "placed_at": 10.0,
     "restart": "", "fingerprint": "f1"},
    {"id": "big-1", "model": "big", "state": "ready", "profile": "four", "nodes": ["gpu-1", "gpu-2"], "placed_at": 20.0,
     "restart": "", "fingerprint": "f2"},
]  # fmt: skip
MODELS = {"chat": {"owner": "org/team", "class": "critical"}, "big": {"owner": "org", "class": "opportunistic"}}


def ids(rows: list[dict]) -> list[str]:
    return [r["id"] for r in rows]


# --------------------------------------------------------------------------- selectors


@pytest.mark.parametrize(
    "selector, expected",
    [
        ("state=ready", ["chat-1", "big-1"]),
        ("state==ready", ["chat-1", "big-1"]),
        ("state!=ready", ["chat-2"]),
        ("state=ready,model=chat", ["chat-1"]),  # a comma ANDs
        ("owner=org/team", ["chat-1", "chat-2"]),  # the model's owner
        ("class=opportunistic", ["big-1"]),  # the model's class
        ("priority=critical", ["chat-1", "chat-2"]),  # kubectl's hands may say priority
        ("node=gpu-2", ["chat-2", "big-1"]),  # a list field: one of its items
        ("node!=gpu-1", ["chat-2"]),  # none of its items
        ("name in (chat-2, big-1)", ["chat-2", "big-1"]),
        ("state notin (ready)", ["chat-2"]),
        ("class", ["chat-1", "chat-2", "big-1"]),  # has the key
        ("!restart_reason", ["chat-1", "chat-2", "big-1"]),  # has not
    ],
)
def test_selectors_pick_replicas_by_field_owner_class_state(selector, expected):
    reqs = selectors.parse(selector)
    selectors.check("replicas", tuple(r for r in reqs if r.key != "restart_reason"))
    assert ids(selectors.select("replicas", REPLICAS, reqs, MODELS)) == expected


def test_selectors_on_nodes_take_labels_and_location_by_short_kind():
    nodes = [
        {"name": "gpu-1", "state": "ready", "labels": {"llmgw.io/rack": "r1", "zone": "a"}, "location": {"rack": "r1"}},
        {"name": "gpu-2", "state": "lost", "labels": {}, "location": {}},
    ]
    pick = lambda s: [n["name"] for n in selectors.select("nodes", nodes, selectors.parse(s))]  # noqa: E731
    assert pick("rack=r1") == ["gpu-1"]
    assert pick("llmgw.io/rack=r1") == ["gpu-1"]
    assert pick("!zone") == ["gpu-2"]
    assert pick("state=lost") == ["gpu-2"]
    selectors.check("nodes", selectors.parse("anything=goes"))  # a node may carry any label


def test_a_model_state_in_a_word():
    assert selectors.model_state({"parked": "failed 5 times", "ready": 0, "desired": 1}) == "parked"
    assert selectors.model_state({"parked": "", "ready": 2, "desired": 2}) == "ready"
    assert selectors.model_state({"parked": "", "ready": 0, "desired": 1, "waiting": "no room"}) == "waiting"
    assert selectors.model_state({"parked": "", "ready": 0, "desired": 1, "waiting": ""}) == "progressing"


@pytest.mark.parametrize("bad", ["", "a b", "state=", "=x", "state in ()", "a,,b", "state=ready,"])
def test_a_selector_that_cannot_be_read_is_refused(bad):
    if bad in ("state=", "state=ready,"):  # kubectl takes an empty value, and a trailing comma
        selectors.parse(bad)
        return
    with pytest.raises(selectors.SelectorError):
        selectors.parse(bad)


def test_a_key_no_row_of_the_kind_has_is_a_typo_with_what_it_meant():
    with pytest.raises(selectors.SelectorError, match="did you mean state"):
        selectors.check("replicas", selectors.parse("sate=ready"))


# --------------------------------------------------------------------------- JSONPath


@pytest.mark.parametrize(
    "kubectl, ng",
    [
        (".items[*].name", "$.items[*].name"),
        ("{.items[*].name}", "$.items[*].name"),
        ("name", "$.name"),  # relaxed, as --sort-by and custom columns take it
        ("$..name", "$..name"),
        (".labels.llmgw\\.io/rack", '$.labels."llmgw.io/rack"'),  # kubectl's escaped dot
        (".labels['llmgw.io/rack']", "$.labels['llmgw.io/rack']"),
        ('.items[?(@.state=="ready")].id', '$.items[?(@.state=="ready")].id'),
        (".", "$"),
    ],
)
def test_kubectl_paths_become_jsonpath_ng_paths(kubectl, ng):
    assert to_jsonpath_ng(kubectl) == ng


def test_templates_as_kubectl_renders_them():
    data = {"kind": "List", "items": REPLICAS}
    assert Template('{range .items[*]}{.id}{"\\t"}{.state}{"\\n"}{end}').render(data) == (
        "chat-1\tready\nchat-2\tloading\nbig-1\tready\n"
    )
    assert Template("{.items[*].id}").render(data) == "chat-1 chat-2 big-1"  # several: a space between
    assert Template('{.items[?(@.state=="loading")].id}').render(data) == "chat-2"
    assert Template("{.items[0].nodes}").render(data) == '["gpu-1"]'  # not a string: JSON
    assert Template("{.items[0].placed_at}").render(data) == "30.0"
    assert Template("{.items[0].labels.llmgw\\.io/rack}").render(data) == "r1"
    assert Template("ids: {range .items}{.id},{end}").render(data) == "ids: chat-1,chat-2,big-1,"
    assert Template("{.items[0].nothing}").render(data) == ""  # missing keys allowed, as kubectl's get
    assert Template(".items[1].id").render(data) == "chat-2"  # no braces: the path
    # What came from the log is made printable where asked; the template's own words are not touched.
    assert Template('{.x}{"\\n"}').render({"x": "a\x1b[2Jb"}, lambda t: t.replace("\x1b", "\\x1b")) == "a\\x1b[2Jb\n"


@pytest.mark.parametrize("bad", ["{.items[}", "{range .items}", "{end}", '{"\\q"}', "{.items[?(@.x=)]}"])
def test_a_template_that_cannot_be_read_is_refused(bad):
    with pytest.raises(JsonPathError):
        Template(bad)


# --------------------------------------------------------------------------- -o and --sort-by


def test_output_formats_parse_as_kubectl_names_them():
    assert parse_output("wide").format == "wide"
    assert parse_output("jsonpath={.items[*].id}").format == "jsonpath"
    out = parse_output("custom-columns=ID:.id,FIRST:.nodes[0],BOTH:.nodes[0,1]")
    assert [h for h, _ in out.columns] == ["ID", "FIRST", "BOTH"]  # a comma inside brackets is the path's
    for bad in ("xml", "jsonpath=", "custom-columns=", "custom-columns=ID", "custom-columns=ID:.id,:x", "jsonpath={.x"):
        with pytest.raises(argparse.ArgumentTypeError):
            parse_output(bad)


def test_custom_columns_and_jsonpath_render_the_rows_as_json_shows_them():
    out = parse_output("custom-columns=ID:.id,NODES:.nodes[*],AT:.placed_at_iso,NONE:.nothing")
    text = render("replicas", REPLICAS[:2], out).splitlines()
    assert text[0].split() == ["ID", "NODES", "AT", "NONE"]
    assert text[1].split() == ["chat-1", "gpu-1", "1970-01-01T00:00:30.000Z", "<none>"]
    assert render("replicas", REPLICAS[:1], out, headers=False).split()[0] == "chat-1"
    # A listing is kubectl's List; one object named is the object.
    assert render("replicas", REPLICAS, parse_output("jsonpath={.kind} {.items[2].id}")) == "List big-1"
    assert render("replicas", REPLICAS[:1], parse_output("jsonpath={.state}"), single=True) == "ready"
    assert json.loads(render("replicas", REPLICAS[:1], Output("json"), single=True))["id"] == "chat-1"
    assert isinstance(json.loads(render("replicas", REPLICAS[:1], Output("json"))), list)


def test_sort_by_a_field_or_a_path_numbers_by_value_missing_last():
    assert ids(sort_rows("replicas", REPLICAS, "placed_at")) == ["chat-2", "big-1", "chat-1"]
    assert ids(sort_rows("replicas", REPLICAS, "{.placed_at}")) == ["chat-2", "big-1", "chat-1"]
    assert ids(sort_rows("replicas", REPLICAS, ".id")) == ["big-1", "chat-1", "chat-2"]
    assert ids(sort_rows("replicas", REPLICAS, ".labels.llmgw\\.io/rack")) == ["chat-1", "chat-2", "big-1"]
    with pytest.raises(JsonPathError, match="no replicas have it"):
        sort_rows("replicas", REPLICAS, ".nope")
    assert sort_rows("replicas", [], ".nope") == []


def test_a_json_watch_prints_json_lines_from_the_first_line_on():
    watch = Watch("replicas", Output("json"))
    first = watch.first(REPLICAS[:2]).splitlines()
    assert [json.loads(line)["type"] for line in first] == ["ADDED", "ADDED"]
    assert json.loads(first[0])["object"]["placed_at_iso"] == "1970-01-01T00:00:30.000Z"
    assert json.loads(watch.change("MODIFIED", REPLICAS[1]))["type"] == "MODIFIED"
    assert watch.first([]) == ""
    columns = Watch("replicas", parse_output("custom-columns=ID:.id,STATE:.state"))
    assert columns.first(REPLICAS[:1]).splitlines()[0].split() == ["EVENT", "ID", "STATE"]
    assert columns.change("DELETED", REPLICAS[0]).split() == ["DELETED", "chat-1", "ready"]
    template = Watch("replicas", parse_output("jsonpath={.id}={.state}"))
    assert template.first(REPLICAS[:2]) == "chat-1=ready\nchat-2=loading"


# --------------------------------------------------------------------------- owners and API keys


def catalog_state() -> State:
    state = State()
    events = [
        ev.OwnerApplied(at=1.0, name="org", guarantee=ev.Resources(gpus=8), limit=ev.Limit(gpus=16)),
        ev.OwnerApplied(at=1.0, name="org/team", guarantee=ev.Resources(gpus=2)),
        ev.ModelApplied(at=1.0, model=ev.ModelSpec(name="chat", owner="org/team", priority="critical",
                                                   profiles=[ev.ProfileSpec(name="p", gpus=1)])),
        ev.ApiKeyApplied(at=1.0, name="team-key", owner="org/team", key_sha256="ab" * 32, requests_per_minute=60),
        ev.ApiKeyApplied(at=1.0, name="lab-key", owner="lab", key_sha256="cd" * 32),
    ]  # fmt: skip
    for seq, e in enumerate(events, 1):
        apply(state, seq, ev.subject_for(e), ev.encode(e))
    return state


def test_owners_list_the_catalog_and_those_only_named():
    rows = {r["name"]: r for r in owners_rows(catalog_state())}
    assert set(rows) == {"org", "org/team", "lab"}
    assert rows["org/team"]["parent"] == "org" and rows["org/team"]["models"] == ["chat"]
    assert rows["org/team"]["api_keys"] == ["team-key"]
    assert rows["lab"]["defined"] is False and rows["lab"]["api_keys"] == ["lab-key"]
    table = views.render("owners", list(rows.values()), "table")
    assert "8 GPUs" in table and "16 GPUs" in table


def test_api_keys_show_names_owners_limits_and_never_a_hash():
    rows = apikeys_rows(catalog_state())
    assert [(r["name"], r["owner"], r["requests_per_minute"]) for r in rows] == [("lab-key", "lab", 0), ("team-key", "org/team", 60)]
    for output in ("table", "wide", "json", "yaml", "name"):
        text = views.render("apikeys", rows, output)
        assert "ab" * 32 not in text and "cd" * 32 not in text and "sha256" not in text
    assert "ab" * 32 not in render("apikeys", rows, parse_output("jsonpath={..key_sha256}{..*}"))


# --------------------------------------------------------------------------- the command line


def test_get_takes_names_anywhere_selectors_and_outputs_as_kubectl():
    p = parser()
    args, extra = p.parse_known_args(["ctl", "get", "replica", "smollm2-1"])
    assert args.kind == "replicas" and args.names == ["smollm2-1"] and not extra
    args, _ = p.parse_known_args(["ctl", "get", "keys", "-l", "owner=org/team", "--sort-by", ".name"])
    assert args.kind == "apikeys" and str(args.selector[0]) == "owner=org/team" and args.sort_by == ".name"
    args, _ = p.parse_known_args(["ctl", "get", "own", "-o", "custom-columns=N:.name"])
    assert args.kind == "owners" and args.output.format == "custom-columns"


# --------------------------------------------------------------------------- describe model: load folded


def test_load_reports_fold_into_one_line_per_interval_in_place():
    from llmgw.ctl.loadfold import fold

    def report(seq, at, gw):
        return {"seq": seq, "at": at, "type": "model.load", "subject": f"llmgw.gw.{gw}.model.load",
                "summary": f"load on chat from gateway {gw}", "decisions": []}

    history = [
        {"seq": 1, "at": 50.0, "type": "model.applied", "subject": "llmgw.ctl.model.applied", "summary": "applied",
         "decisions": []},
        report(2, 61.0, "gw-a"), report(3, 62.0, "gw-b"),
        {"seq": 4, "at": 63.0, "type": "control.decided", "subject": "llmgw.control.decided", "summary": "decided",
         "decisions": [{"kind": "scale", "model": "chat", "reason": "load", "voided": ""}]},
        report(5, 100.0, "gw-a"), report(6, 130.0, "gw-a"),
    ]  # fmt: skip
    numbers = {2: {"in_flight": 3, "queued": 1, "tokens_in": 10, "tokens_out": 5},
               3: {"in_flight": 1, "queued": 4, "tokens_in": 20, "tokens_out": 7},
               5: {"in_flight": 2, "queued": 0, "tokens_in": 1, "tokens_out": 1}}  # (6 not read: counted as a report)
    folded = fold(history, numbers, 60.0)
    assert [e["type"] for e in folded] == ["model.applied", "load.interval", "control.decided", "load.interval"]
    first, second = folded[1], folded[3]
    assert first["seqs"] == "2-5" and first["at"] == 60.0
    assert first["summary"] == ("load 00:01:00–00:02:00: 3 reports from gateways gw-a, gw-b; at most 3 in flight, "
                                "4 queued; 31 tokens in, 13 out")
    assert first["load"]["tokens_in"] == 31 and first["load"]["gateways"] == ["gw-a", "gw-b"]
    assert second["seqs"] == "6" and second["summary"].startswith("load 00:02:00–00:03:00: 1 report from gateway gw-a")
    # Without the log's numbers: reports and gateways, from the subjects.
    plain = fold(history, None, 60.0)[1]
    assert plain["summary"] == "load 00:01:00–00:02:00: 3 reports from gateways gw-a, gw-b" and "tokens_in" not in plain["load"]
    text = views.describe("model", {"name": "chat", "model": None, "replicas": [], "history": folded}, "text")
    assert "2-5" in text and "load on chat" not in text
