#!/usr/bin/env python3
"""Writes the committed seed corpus (fuzz/corpus/<target>/) and the
dictionaries (fuzz/dict/<target>.dict). Deterministic: run it again after
changing a seed, and commit what it writes. The fuzzers themselves never
write into fuzz/corpus (hack/fuzz.sh runs them on a copy).

Seeds: a handful of valid inputs per target, taken from the AdmissionReview
fixtures (webhooks/), the lock info OpenTofu's kubernetes backend writes,
states shaped as Terraform and OpenTofu write them, and result documents as
the runner writes them (src/runner/result.rs).
"""

import gzip
import io
import json
import os
import shutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FUZZ = os.path.join(ROOT, "fuzz")


def compact(value):
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode()


def gz(data):
    out = io.BytesIO()
    with gzip.GzipFile(fileobj=out, mode="wb", mtime=0) as f:
        f.write(data)
    return out.getvalue()


def write(target, name, data):
    directory = os.path.join(FUZZ, "corpus", target)
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, name), "wb") as f:
        f.write(data)


def write_dict(target, words):
    os.makedirs(os.path.join(FUZZ, "dict"), exist_ok=True)
    with open(os.path.join(FUZZ, "dict", target + ".dict"), "w") as f:
        f.write("# libFuzzer dictionary, written by fuzz/seeds.py\n")
        raw = {w if isinstance(w, bytes) else w.encode() for w in words}
        for word in sorted(raw):
            escaped = "".join(
                "\\" + c if c in '"\\' else c if 0x20 <= ord(c) < 0x7F else "\\x%02x" % ord(c)
                for c in word.decode("latin-1")
            )
            f.write('"%s"\n' % escaped)


def strings_of(value, keys, strings):
    if isinstance(value, dict):
        for k, v in value.items():
            keys.add(k)
            strings_of(v, keys, strings)
    elif isinstance(value, list):
        for v in value:
            strings_of(v, keys, strings)
    elif isinstance(value, str) and len(value) <= 40:
        strings.add(value)


def admission_review():
    target = "admission_review"
    fixtures = [
        # (hook, fixture): `m` selects /mutate, `v` /validate.
        ("m", "defaults/cluster.mutate"),  # TerraformCluster CREATE
        ("m", "defaults/machine.mutate"),
        ("m", "defaults/pool-with-drift-interval.mutate"),
        ("m", "defaults/machine-stored-without-defaults-updated.mutate"),  # UPDATE
        ("m", "defaults/template-untouched.mutate"),
        ("v", "cluster/endpoint-set-once.validate"),
        ("v", "variables/valid.validate"),
        ("v", "variables/reserved-prefix.validate"),
        ("v", "machine/delete-without-machine-owner.validate"),  # DELETE
        ("v", "identity/allowed-namespaces-empty.validate"),
        ("v", "template/spec-changed.validate"),
        ("v", "restore-state/update-listed.validate"),
        ("v", "jobs-env/reserved-names-warned.validate"),
    ]
    keys, strings = set(), set()
    for hook, fixture in fixtures:
        with open(os.path.join(ROOT, "webhooks", fixture + ".request.json")) as f:
            review = json.load(f)
        strings_of(review, keys, strings)
        name = fixture.replace("/", "-").replace(".", "-")
        write(target, name, hook.encode() + compact(review))

    # Past the length where the values of an object are counted (a quarter
    # of MAX_VALUES, 16384 bytes): one under the cap, one over it.
    with open(os.path.join(ROOT, "webhooks", "variables/valid.validate.request.json")) as f:
        base = json.load(f)
    for name, count in [("variables-counted-under-cap", 2400), ("variables-over-cap", 3700)]:
        review = json.loads(json.dumps(base))
        review["request"]["object"]["spec"]["variables"] = {"big": [{"": 0}] * count}
        write(target, name, b"v" + compact(review))

    words = {'"%s"' % k for k in keys} | {'"%s"' % s for s in strings}
    words |= {"CREATE", "UPDATE", "DELETE", "CONNECT", "null", "true", "false", "{}", "[]"}
    write_dict(target, words)


STATE = {
    "version": 4,
    "terraform_version": "1.12.6",
    "serial": 7,
    "lineage": "7c0e6e4e-1f0b-4b35-9d3a-5a5f5d1b2c3d",
    "outputs": {
        "endpoint": {"value": "10.0.0.1", "type": "string"},
        "port": {"value": 6443, "type": "number"},
        "kubeconfig": {"value": "apiVersion: v1\nkind: Config\n", "type": "string", "sensitive": True},
        "nodes": {
            "value": [{"name": "n0", "id": "i-0"}, {"name": "n1", "id": "i-1"}],
            "type": ["list", ["object", {"id": "string", "name": "string"}]],
        },
    },
    "resources": [
        {
            "mode": "managed",
            "type": "terraform_data",
            "name": "node",
            "provider": 'provider["terraform.io/builtin/terraform"]',
            "instances": [
                {"index_key": 0, "schema_version": 0, "attributes": {"id": "a", "input": None}},
                {"index_key": 1, "deposed": "00000001", "attributes": {"id": "b"}},
            ],
        },
        {
            "mode": "data",
            "type": "terraform_remote_state",
            "name": "up",
            "provider": 'provider["terraform.io/builtin/terraform"]',
            "instances": [{"attributes": {"backend": "local", "outputs": {"value": {}}}}],
        },
    ],
    "check_results": None,
}


def state_reader():
    target = "state_reader"
    # The flag byte: bit 0 set means the payload is already compressed;
    # bits 1-2 are the chunk count less one; bit 3 two gzip members; bit 4
    # reverse order; bit 5 a leading zero in the last part's index; bit 6 no
    # tfstate key on the last chunk; bit 7 stored rather than deflated.
    pretty = json.dumps(STATE, indent=2).encode()
    write(target, "json-one-chunk", b"\x00" + pretty)
    write(target, "json-three-chunks-reversed", bytes([0b0001_0100]) + compact(STATE))
    write(target, "json-two-members-stored", bytes([0b1000_1010]) + compact(STATE))
    opentofu = dict(STATE, terraform_version="1.10.0", outputs={}, resources=[])
    write(target, "json-opentofu-empty", b"\x00" + json.dumps(opentofu, indent=2).encode())
    envelope = {
        "meta": {"key_provider.pbkdf2.main": "eyJzYWx0IjoiIn0="},
        "encrypted_data": "c2VjcmV0",
        "encryption_version": "v0",
    }
    write(target, "json-encrypted-envelope", b"\x00" + compact(envelope))
    write(target, "json-version-3", b"\x00" + compact({"version": 3, "serial": 1, "modules": []}))
    # Already compressed, as Terraform writes it: gzip, then cut into parts.
    write(target, "gzip-two-chunks", bytes([0b0000_0011]) + gz(pretty))
    write(target, "gzip-two-members", b"\x01" + gz(compact(STATE)[:200]) + gz(compact(STATE)[200:]))
    write(target, "json-escapes", b"\x00" + json.dumps(
        {"version": 4, "serial": 1, "lineage": "l\u00e9\\\"", "outputs": {"\u00e9": {"value": "\ud83d\ude00<>&", "type": "string"}}},
        ensure_ascii=True).encode())
    words = ['"version"', '"serial"', '"lineage"', '"terraform_version"', '"outputs"',
             '"resources"', '"mode"', '"managed"', '"data"', '"instances"', '"deposed"',
             '"encryption_version"', '"value"', '"type"', '"sensitive"', '"attributes"',
             '"index_key"', "true", "false", "null", "\\u0000", "\\ud83d\\ude00", "18446744073709551615",
             "18446744073709551616", "1e400", "-0", b"\x1f\x8b\x08\x00"]
    write_dict(target, words)


def lock_info():
    target = "lock_info"
    real = {
        "ID": "8f2b1c7e-1d2a-4c3b-9e8f-0a1b2c3d4e5f",
        "Operation": "OperationTypeApply",
        "Info": "",
        "Who": "runner@captf-m-foo-apply-a1-abc123-x7k2p",
        "Version": "1.12.6",
        "Created": "2026-12-02T10:00:00.123456789Z",
        "Path": "",
    }
    write(target, "own-pod", compact(real))
    write(target, "own-pod-no-id", compact({k: v for k, v in real.items() if k != "ID"}))
    write(target, "foreign-user", compact(dict(real, Who="alice@laptop", Created="2026-12-02T11:00:00+01:00")))
    write(target, "foreign-other-object", compact(dict(real, Who="runner@captf-m-bar-apply-a1-abc123-x7k2p")))
    write(target, "extra-fields", compact({"Who": "alice@laptop", "Extra": {"nested": [1, 2]}, "Later": 7, "id": 5}))
    write(target, "wrong-type", compact({"ID": 5, "Who": real["Who"]}))
    write(target, "long-info", compact(dict(real, Info="x" * 300 + "\u00e9")))
    words = ['"ID"', '"Operation"', '"Info"', '"Who"', '"Version"', '"Created"', '"Path"',
             "OperationTypeApply", "OperationTypePlan", "runner@", "captf-m-foo-", "-apply-a1-",
             "abc123", "x7k2p", "2026-12-02T10:00:00Z", "null"]
    write_dict(target, words)


def run_result():
    target = "run_result"
    steps = [
        {"name": "init", "exitCode": 0, "durationMilliseconds": 1234,
         "args": ["init", "-input=false", "-backend-config=namespace=(elided)"]},
        {"name": "validate", "exitCode": 0, "durationMilliseconds": 80},
        {"name": "apply", "exitCode": 0, "durationMilliseconds": 45000},
    ]
    base = {
        "operation": "apply",
        "job": "captf-m-foo-apply-a1-abc123",
        "image": "registry.example/roles/machine:1.0",
        "runtimeVersion": "1.12.6",
        "steps": steps,
    }
    write(target, "apply-succeeded", compact(dict(base, changed={"add": 2, "change": 1, "destroy": 0})))
    write(target, "apply-failed-step", compact(dict(
        base,
        steps=steps[:2] + [{"name": "apply", "exitCode": 1, "durationMilliseconds": 900}],
        error={"kind": "step", "step": "apply", "summary": "Error: creating instance: quota exceeded"})))
    plan = {"planHash": "p1:" + "a" * 64, "add": 1, "change": 0, "destroy": 1,
            "resources": ["module.role.terraform_data.node[0] (replace)"], "destructive": True}
    write(target, "plan-blocked", compact(dict(
        base, operation="plan", plan=plan,
        error={"kind": "blocked", "summary": "the plan destroys 1 resource"})))
    write(target, "plan-changed", compact(dict(
        base, plan=dict(plan, truncated=True), error={"kind": "plan-changed"})))
    write(target, "image-layout", compact({"operation": "apply", "error": {
        "kind": "image-layout", "summary": "/module has no .tf files"}}))
    write(target, "drift-interrupted", compact({"operation": "drift", "steps": steps[:1], "error": {
        "kind": "interrupted", "step": "plan", "summary": "terminated by SIGTERM"}}))
    write(target, "restore", compact({"operation": "restore", "runtimeVersion": "1.10.0", "steps": [
        {"name": "state-push", "exitCode": 0, "durationMilliseconds": 300}]}))
    # Found by `make fuzz`: an error step past the CRD's 64 characters.
    write(target, "finding-long-error-step", compact(dict(
        base, steps=steps[:1], error={"kind": "step", "step": "apply" + "t" * 92, "summary": ""})))
    words = ['"operation"', '"job"', '"image"', '"runtimeVersion"', '"steps"', '"changed"',
             '"plan"', '"error"', '"name"', '"exitCode"', '"durationMilliseconds"', '"args"',
             '"kind"', '"step"', '"summary"', '"planHash"', '"add"', '"change"', '"destroy"',
             '"import"', '"resources"', '"truncated"', '"destructive"', '"apply"', '"destroy"',
             '"drift"', '"refresh"', '"restore"', '"plan"', '"image-layout"', '"interrupted"',
             '"blocked"', '"plan-changed"', '""', "null", "-1", "4294967296"]
    write_dict(target, words)


def main():
    for target in ["admission_review", "state_reader", "lock_info", "run_result"]:
        shutil.rmtree(os.path.join(FUZZ, "corpus", target), ignore_errors=True)
    admission_review()
    state_reader()
    lock_info()
    run_result()


if __name__ == "__main__":
    main()
