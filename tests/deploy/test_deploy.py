"""Checks the files under deploy/ with the real tools where they exist.

* deploy/prometheus/alerts.yml: `promtool check rules` and `promtool test rules` on
  deploy/prometheus/alerts_test.yml (Debian's `prometheus` package provides promtool).
* deploy/grafana/fragscope.json: the fields Grafana needs to import a dashboard, every
  panel's datasource and targets, and every expression parses as PromQL (promtool, through a
  throw-away rules file).
* Every fragscope_* metric any expression uses is one the exporter documents (docs/exporter.md
  when present, else the exporter list in docs/alerts.md).
* deploy/fragscope.toml.example passes `fragscope alerts check` (when FRAGSCOPE_BIN is set).

A test that needs promtool skips without it, except under FRAGSCOPE_REQUIRE_TOOLS=1 (ctest
sets it), where it fails.

Run by ctest as `deploy_files`; by hand: /usr/bin/python3 -m pytest tests/deploy.
"""
import json
import os
import re
import shutil
import subprocess
import tempfile

import pytest

SOURCE_DIR = os.environ.get(
    "FRAGSCOPE_SOURCE_DIR",
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
DEPLOY = os.path.join(SOURCE_DIR, "deploy")
REQUIRE_TOOLS = os.environ.get("FRAGSCOPE_REQUIRE_TOOLS") == "1"


@pytest.fixture
def promtool():
    """promtool's path. Missing: the test skips, or fails under FRAGSCOPE_REQUIRE_TOOLS=1 (set
    by ctest: tools/install-deps.sh installs Debian's prometheus, which provides it)."""
    path = shutil.which("promtool")
    if path:
        return path
    message = "promtool not installed (Debian package prometheus; tools/install-deps.sh)"
    if REQUIRE_TOOLS:
        pytest.fail(message + " and FRAGSCOPE_REQUIRE_TOOLS=1", pytrace=False)
    pytest.skip(message)

# Metrics of other exporters the dashboard joins with, and Prometheus' own.
EXTERNAL_METRICS = {"up", "DCGM_FI_DEV_FB_USED"}


def documented_metrics():
    exporter = os.path.join(SOURCE_DIR, "docs", "exporter.md")
    path = exporter if os.path.exists(exporter) else os.path.join(SOURCE_DIR, "docs", "alerts.md")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    names = set(re.findall(r"`(fragscope_[a-z0-9_]+)", text))
    assert names, f"no fragscope_* metric documented in {path}"
    return path, names


def metric_names(expr):
    """fragscope_*/DCGM_*/up identifiers outside label matchers {...}."""
    outside = re.sub(r"\{[^}]*\}", "{}", expr)
    return set(re.findall(r"\b(fragscope_[a-z0-9_]+|DCGM_[A-Z0-9_]+|up)\b(?!\s*\()", outside))


def load_rules():
    import yaml  # python3-yaml, a dependency of many Debian packages
    with open(os.path.join(DEPLOY, "prometheus", "alerts.yml"), encoding="utf-8") as f:
        return yaml.safe_load(f)


def load_dashboard():
    with open(os.path.join(DEPLOY, "grafana", "fragscope.json"), encoding="utf-8") as f:
        return json.load(f)


def dashboard_targets(dash):
    for panel in dash["panels"]:
        for target in panel.get("targets", []):
            yield panel, target


def test_promtool_check_rules(promtool):
    out = subprocess.run([promtool, "check", "rules", os.path.join(DEPLOY, "prometheus", "alerts.yml")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_promtool_test_rules(promtool):
    out = subprocess.run([promtool, "test", "rules", "alerts_test.yml"],
                         cwd=os.path.join(DEPLOY, "prometheus"),
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_every_alert_has_severity_summary_and_a_unit_test():
    rules = [r for g in load_rules()["groups"] for r in g["rules"]]
    with open(os.path.join(DEPLOY, "prometheus", "alerts_test.yml"), encoding="utf-8") as f:
        tests = f.read()
    for rule in rules:
        assert rule["labels"]["severity"] in ("info", "warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"], rule["alert"]
        assert f"alertname: {rule['alert']}\n" in tests, f"{rule['alert']} has no promtool test"


def test_rule_metrics_are_documented():
    path, documented = documented_metrics()
    for group in load_rules()["groups"]:
        for rule in group["rules"]:
            names = metric_names(rule["expr"])
            assert names, rule["alert"]
            unknown = {n for n in names if n not in documented and n not in EXTERNAL_METRICS}
            assert not unknown, f"{rule['alert']}: {sorted(unknown)} not in {path}"


def test_dashboard_has_what_grafana_needs_to_import_it():
    dash = load_dashboard()
    assert isinstance(dash["schemaVersion"], int) and dash["schemaVersion"] >= 30
    assert dash["title"] and dash["uid"]
    assert dash["panels"]
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in dash["panels"]:
        assert panel["type"] and panel["title"], panel
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["type"] == "prometheus", panel["title"]
        assert panel["datasource"]["uid"] == "${datasource}", panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["expr"].strip(), panel["title"]
            assert target["refId"], panel["title"]
    # The panels the issue asks for.
    exprs = " ".join(t["expr"] for _, t in dashboard_targets(dash))
    for metric in ("fragscope_process_reserved_bytes", "fragscope_process_allocated_bytes",
                   "fragscope_process_largest_free_block_bytes",
                   "fragscope_process_max_allocatable_bytes",
                   "fragscope_process_fragmentation_ratio", "fragscope_process_forecast_level",
                   "fragscope_process_stranded_bytes", "fragscope_process_free_blocks",
                   "DCGM_FI_DEV_FB_USED"):
        assert metric in exprs, metric


def variable_queries(dash):
    """(name, PromQL) of the dashboard's query variables: templating.list[].query, a string or
    Grafana's {"query": ...} object."""
    for var in dash.get("templating", {}).get("list", []):
        if var.get("type") != "query":
            continue
        query = var.get("query")
        if isinstance(query, dict):
            query = query.get("query")
        assert isinstance(query, str) and query.strip(), f"variable {var['name']!r}: no query"
        yield var["name"], query


def label_values_selector(query):
    """The series selector of Grafana's label_values(selector, label), else the query itself."""
    m = re.fullmatch(r"\s*label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*", query, re.S)
    return m.group(1) if m else query


def test_dashboard_metrics_are_documented():
    path, documented = documented_metrics()
    dash = load_dashboard()
    for panel, target in dashboard_targets(dash):
        names = metric_names(target["expr"])
        assert names, panel["title"]
        unknown = {n for n in names if n not in documented and n not in EXTERNAL_METRICS}
        assert not unknown, f"panel {panel['title']!r}: {sorted(unknown)} not in {path}"
    variables = list(variable_queries(dash))
    assert variables, "the dashboard has no query variable"
    for name, query in variables:
        names = metric_names(label_values_selector(query))
        assert names, f"variable {name!r}: no metric in {query!r}"
        unknown = {n for n in names if n not in documented and n not in EXTERNAL_METRICS}
        assert not unknown, f"variable {name!r}: {sorted(unknown)} not in {path}"


def test_an_undocumented_variable_metric_is_caught():
    """The variable check above can fail: a made-up metric in a variable's query does."""
    _, documented = documented_metrics()
    dash = {"templating": {"list": [{"name": "x", "type": "query", "query": {
        "query": 'label_values(fragscope_no_such_metric{Hostname=~"$Hostname"}, gpu)'}}]}}
    (_, query), = variable_queries(dash)
    assert label_values_selector(query) == 'fragscope_no_such_metric{Hostname=~"$Hostname"}'
    assert metric_names(label_values_selector(query)) == {"fragscope_no_such_metric"}
    assert "fragscope_no_such_metric" not in documented


def promql_of(expr):
    """The expression with Grafana's variables replaced, so promtool can parse it."""
    expr = expr.replace("$__rate_interval", "5m").replace("$__interval", "1m")
    return re.sub(r"\$\{?[A-Za-z_]+\}?", ".*", expr)


def test_dashboard_expressions_parse_as_promql(promtool):
    import yaml
    dash = load_dashboard()
    exprs = [t["expr"] for _, t in dashboard_targets(dash)]
    exprs += [label_values_selector(q) for _, q in variable_queries(dash)]
    rules = [{"record": f"fragscope_dashboard:check_{i}", "expr": promql_of(e)}
             for i, e in enumerate(exprs)]
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "dashboard_rules.yml")
        with open(path, "w", encoding="utf-8") as f:
            yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, f)
        out = subprocess.run([promtool, "check", "rules", path], capture_output=True, text=True,
                             timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_a_broken_expression_is_caught(promtool):
    """The PromQL check above can fail: a broken expression does."""
    import yaml
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "broken.yml")
        with open(path, "w", encoding="utf-8") as f:
            yaml.safe_dump({"groups": [{"name": "x", "rules": [
                {"record": "x:y", "expr": promql_of('sum by (gpu (fragscope_reserved_bytes{gpu=~"$gpu"})')}]}]}, f)
        out = subprocess.run([promtool, "check", "rules", path], capture_output=True, text=True,
                             timeout=60)
    assert out.returncode != 0


def test_example_config_passes_alerts_check():
    binary = os.environ.get("FRAGSCOPE_BIN")
    if not binary:
        pytest.skip("FRAGSCOPE_BIN not set")
    out = subprocess.run([binary, "alerts", "check", os.path.join(DEPLOY, "fragscope.toml.example")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "8 rule(s):" in out.stdout


def test_dashboard_has_a_job_view_worst_rank_first():
    """Issue 22: every rank of a job side by side, the worst first, and the rule that alerts on
    the job's worst rank."""
    dash = load_dashboard()
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert "job_name" in variables, "no job variable"
    job_panels = [p for p in dash["panels"] if p["type"] != "row" and any(
        'job_name=~"$job_name"' in t["expr"] and "rank" in t["expr"] for t in p["targets"])]
    assert len(job_panels) >= 3, [p["title"] for p in job_panels]
    # Sorted worst first: by the query (an instant sort_desc) or by the table's sortBy.
    bars = [p for p in job_panels if p["type"] == "bargauge"]
    assert bars and all(t["expr"].startswith("sort_desc(") and t.get("instant")
                        for p in bars for t in p["targets"]), bars
    tables = [p for p in job_panels if p["type"] == "table"]
    assert tables
    for table in tables:
        sorts = [t for t in table["transformations"] if t["id"] == "sortBy"]
        assert sorts and sorts[0]["options"]["sort"][0]["desc"] is True, table["title"]
        assert {t["refId"] for t in table["targets"]} >= {"A", "B"}
    rules = {r["alert"]: r for g in load_rules()["groups"] for r in g["rules"]}
    job_rule = rules["FragscopeJobRankAtRisk"]
    assert "by (job_name)" in job_rule["expr"] and "topk" in job_rule["expr"]
    assert "{{ $labels.rank }}" in job_rule["annotations"]["summary"]


def test_the_scrape_config_reaches_the_address_the_unit_listens_on():
    """docs/alerts.md's scrape targets are on other hosts; the unit listens where it says.
    Loopback in the unit needs the drop-in the doc gives (issue 29 item 11)."""
    with open(os.path.join(DEPLOY, "systemd", "fragscope.service"), encoding="utf-8") as f:
        unit = f.read()
    with open(os.path.join(SOURCE_DIR, "docs", "alerts.md"), encoding="utf-8") as f:
        doc = f.read()
    listen = re.search(r"^(ExecStart=\S+ serve .*--listen (\S+):(\d+).*)$", unit, re.M)
    assert listen, "the unit's ExecStart gives no --listen"
    line, host, port = listen.groups()
    targets = re.findall(r"targets: \[([^\]]*)\]", doc)
    assert targets, "docs/alerts.md has no scrape config"
    for target in re.findall(r'"([^"]+)"', targets[0]):
        assert target.endswith(":" + port), (target, port)
    if host in ("127.0.0.1", "localhost", "::1"):
        # A remote target then needs the unit's address changed: the doc shows how.
        override = re.search(r"ExecStart=\n(ExecStart=\S+ serve .*--listen (\S+):(\d+).*)", doc)
        assert override, "docs/alerts.md does not say how to listen beyond loopback"
        assert override.group(2) not in ("127.0.0.1", "localhost") and override.group(3) == port
        # The drop-in keeps the unit's other arguments.
        assert override.group(1).replace(override.group(2), host) == line
