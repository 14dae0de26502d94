#!/usr/bin/env python3
"""Writes the AdmissionReview fixtures: for each rule of CONTRACT.md
"Webhooks", requests and the responses the webhook must give, written here by
hand from the contract (not produced by the webhook). tests/webhook_fixtures.rs
sends every request through the real handler and compares.

Run it after changing a case: python3 webhooks/generate.py
"""
import base64, copy, json, os, shutil

HERE = os.path.dirname(os.path.abspath(__file__))
GROUP, VERSION = "infrastructure.cluster.x-k8s.io", "v1alpha1"
PLURALS = {
    "TerraformCluster": "terraformclusters", "TerraformMachine": "terraformmachines",
    "TerraformMachinePool": "terraformmachinepools",
    "TerraformClusterTemplate": "terraformclustertemplates",
    "TerraformMachineTemplate": "terraformmachinetemplates",
    "TerraformMachinePoolTemplate": "terraformmachinepooltemplates",
    "TerraformClusterIdentity": "terraformclusteridentities",
}
IMAGE = "ghcr.io/captf-io/modules/noop:v0.1.0"
LOCK_RULE = ("must be less than activeDeadlineSeconds, so that waiting for the state lock "
             "cannot use up the Job's deadline")
RESTORE = "metadata.annotations[captf.io/restore-state]"
SHAPE = "must be a state serial: a decimal number without leading zeros, from 1 to 18446744073709551615"


def obj(kind, spec, name="sample", annotations=None, status=None, deleting=False):
    meta = {"name": name, "uid": "0b7c7b61-0000-4000-8000-000000000001"}
    if kind != "TerraformClusterIdentity":
        meta["namespace"] = "demo"
    if annotations:
        meta["annotations"] = annotations
    if deleting:
        meta["deletionTimestamp"] = "2026-12-01T00:00:00Z"
        meta["finalizers"] = ["terraformmachine.infrastructure.cluster.x-k8s.io"]
    o = {"apiVersion": f"{GROUP}/{VERSION}", "kind": kind, "metadata": meta, "spec": spec}
    if status is not None:
        o["status"] = status
    return o


def cluster(**extra):
    spec = {"source": {"image": IMAGE}, "identityRef": {"name": "creds"}}
    spec.update(extra)
    return spec


def machine(**extra):
    spec = {"source": {"image": IMAGE}}
    spec.update(extra)
    return spec


def template(spec):
    return {"template": {"spec": spec}}


def review(uid, op, new, old=None, dry_run=False):
    o = new or old
    kind = o["kind"]
    gvk = {"group": GROUP, "version": VERSION, "kind": kind}
    gvr = {"group": GROUP, "version": VERSION, "resource": PLURALS[kind]}
    request = {
        "uid": uid, "kind": gvk, "resource": gvr, "requestKind": gvk, "requestResource": gvr,
        "name": o["metadata"]["name"], "operation": op,
        "userInfo": {"username": "alice", "groups": ["system:authenticated"]},
        "object": new, "oldObject": old, "dryRun": dry_run,
    }
    if "namespace" in o["metadata"]:
        request["namespace"] = o["metadata"]["namespace"]
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}


def allowed(uid, warnings=None, patch=None):
    response = {"uid": uid, "allowed": True}
    if warnings:
        response["warnings"] = warnings
    if patch is not None:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch, separators=(",", ":")).encode()).decode()
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def denied(uid, message, code=422):
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": {
        "uid": uid, "allowed": False,
        "status": {"code": code, "message": message, "reason": "Forbidden" if code == 403 else "Invalid"}}}


CASES = {}


def case(rule, name, hook, request, response):
    CASES.setdefault(rule, []).append((name, hook, request, response))


# Rule 1: lockTimeoutSeconds < activeDeadlineSeconds in every jobs policy.
def lock(rule_cases):
    for i, (name, kind, spec, path, got) in enumerate(rule_cases):
        uid = f"lock-{i}"
        req = review(uid, "CREATE", obj(kind, spec))
        if got is None:
            case("jobs-lock-timeout", name, "validate", req, allowed(uid))
        else:
            case("jobs-lock-timeout", name, "validate", req,
                 denied(uid, f"{path}.lockTimeoutSeconds: {LOCK_RULE} (got {got})"))

lock([
    ("machine-lock-above-deadline", "TerraformMachine",
     machine(jobs={"lockTimeoutSeconds": 600, "activeDeadlineSeconds": 300}), "spec.jobs",
     "lockTimeoutSeconds 600, activeDeadlineSeconds 300"),
    ("machine-lock-alone-at-default-deadline", "TerraformMachine", machine(jobs={"lockTimeoutSeconds": 3600}),
     "spec.jobs", "lockTimeoutSeconds 3600, activeDeadlineSeconds 3600 by default"),
    ("machine-deadline-alone-below-default-lock", "TerraformMachine", machine(jobs={"activeDeadlineSeconds": 200}),
     "spec.jobs", "lockTimeoutSeconds 300 by default, activeDeadlineSeconds 200"),
    ("machine-consistent", "TerraformMachine", machine(jobs={"lockTimeoutSeconds": 60, "activeDeadlineSeconds": 300}),
     None, None),
    ("pool-lock-above-deadline", "TerraformMachinePool",
     machine(jobs={"lockTimeoutSeconds": 600, "activeDeadlineSeconds": 300}), "spec.jobs",
     "lockTimeoutSeconds 600, activeDeadlineSeconds 300"),
    ("cluster-defaults-lock-alone", "TerraformCluster", cluster(defaults={"jobs": {"lockTimeoutSeconds": 3600}}),
     "spec.defaults.jobs", "lockTimeoutSeconds 3600, activeDeadlineSeconds 3600 by default"),
    ("cluster-own-jobs-deadline-alone", "TerraformCluster", cluster(jobs={"activeDeadlineSeconds": 200}),
     "spec.jobs", "lockTimeoutSeconds 300 by default, activeDeadlineSeconds 200"),
    ("machine-template", "TerraformMachineTemplate",
     template(machine(jobs={"lockTimeoutSeconds": 600, "activeDeadlineSeconds": 300})), "spec.template.spec.jobs",
     "lockTimeoutSeconds 600, activeDeadlineSeconds 300"),
    ("pool-template", "TerraformMachinePoolTemplate", template(machine(jobs={"lockTimeoutSeconds": 3600})),
     "spec.template.spec.jobs", "lockTimeoutSeconds 3600, activeDeadlineSeconds 3600 by default"),
    ("cluster-template-defaults", "TerraformClusterTemplate",
     template(cluster(defaults={"jobs": {"activeDeadlineSeconds": 200}})), "spec.template.spec.defaults.jobs",
     "lockTimeoutSeconds 300 by default, activeDeadlineSeconds 200"),
    ("cluster-template-consistent", "TerraformClusterTemplate",
     template(cluster(jobs={"lockTimeoutSeconds": 60, "activeDeadlineSeconds": 300})), None, None),
])

# Rule 2: captf.io/restore-state.
BACKUPS = {"stateBackups": [{"serial": 7, "takenAt": "2026-12-01T00:00:00Z", "bytes": 100},
                            {"serial": 5, "takenAt": "2026-11-30T00:00:00Z", "bytes": 90}]}
for value, ok in [("7", True), ("07", False), ("-1", False), ("abc", False), ("", False),
                  ("18446744073709551616", False), ("18446744073709551615", True)]:
    uid = f"restore-create-{value or 'empty'}"
    req = review(uid, "CREATE", obj("TerraformMachine", machine(), annotations={"captf.io/restore-state": value}))
    resp = allowed(uid) if ok else denied(uid, f'{RESTORE}: {SHAPE} (got {json.dumps(value)})')
    case("restore-state", f"create-{value or 'empty'}", "validate", req, resp)

old = obj("TerraformMachinePool", machine(), status=BACKUPS)
new = copy.deepcopy(old); new["metadata"]["annotations"] = {"captf.io/restore-state": "9"}
case("restore-state", "update-unlisted", "validate", review("restore-unlisted", "UPDATE", new, old),
     denied("restore-unlisted", f'{RESTORE}: must name a serial listed in status.stateBackups (listed: 7, 5) (got "9")'))
new = copy.deepcopy(old); new["metadata"]["annotations"] = {"captf.io/restore-state": "5"}
case("restore-state", "update-listed", "validate", review("restore-listed", "UPDATE", new, old), allowed("restore-listed"))
old = obj("TerraformMachine", machine(), status=BACKUPS, deleting=True)
new = copy.deepcopy(old); new["metadata"]["annotations"] = {"captf.io/restore-state": "7"}
case("restore-state", "update-while-deleting", "validate", review("restore-deleting", "UPDATE", new, old),
     denied("restore-deleting", f'{RESTORE}: cannot be added or changed while the object is being deleted: '
            'deletion wins over a restore (got "7")', code=403))

# Rule 3: the other rules of ref §1.4.
def single(rule, name, kind, spec, message, uid, op="CREATE", old_spec=None, dry_run=False, code=422):
    new = obj(kind, spec)
    old = obj(kind, old_spec) if old_spec is not None else None
    resp = allowed(uid) if message is None else denied(uid, message, code)
    case(rule, name, "validate", review(uid, op, new, old, dry_run), resp)

single("variables", "meta-argument", "TerraformMachine", machine(variables={"count": 3}),
       'spec.variables.count: must not be a Terraform meta-argument (got "count")', "vars-meta")
single("variables", "reserved-prefix", "TerraformCluster", cluster(variables={"captf_x": 1}),
       'spec.variables.captf_x: must not begin with captf_, which is reserved for the contract\'s inputs (got "captf_x")',
       "vars-prefix")
single("variables", "contract-input", "TerraformMachinePool", machine(variables={"replicas": 3}),
       'spec.variables.replicas: must not be a contract input of the module\'s role (got "replicas")', "vars-input")
single("variables", "not-an-identifier", "TerraformMachine", machine(variables={"9lives": 1}),
       'spec.variables.9lives: must match ^[a-zA-Z_][a-zA-Z0-9_-]*$ (got "9lives")', "vars-ident")
single("variables", "valid", "TerraformMachine", machine(variables={"region": "eu-west-1", "size": 3}), None, "vars-ok")
single("variables-from", "both-refs", "TerraformMachine",
       machine(variablesFrom=[{"configMapRef": {"name": "a"}, "secretRef": {"name": "b"}}]),
       "spec.variablesFrom[0]: must set exactly one of configMapRef and secretRef (got both)", "vf-both")
single("image", "uppercase-repository", "TerraformMachine", {"source": {"image": "ghcr.io/x/Noop:v1"}},
       'spec.source.image: must be an OCI image reference: it has an invalid repository path component "Noop" '
       '(lowercase letters, digits and separators . _ __ - only) (got "ghcr.io/x/Noop:v1")', "image-upper")
single("image", "digest", "TerraformMachine",
       {"source": {"image": "ghcr.io/x/noop@sha256:" + "ab" * 32}}, None, "image-digest")
single("security-context", "privileged", "TerraformMachine", machine(jobs={"securityContext": {"privileged": True}}),
       "spec.jobs.securityContext.privileged: must not be true (got true)", "sc-priv")
single("security-context", "capabilities-add", "TerraformCluster",
       cluster(defaults={"jobs": {"securityContext": {"capabilities": {"add": ["NET_ADMIN"]}}}}),
       'spec.defaults.jobs.securityContext.capabilities.add: must be empty: a Job adds no capabilities (got ["NET_ADMIN"])',
       "sc-caps")
single("cluster", "identity-ref-required", "TerraformCluster", {"source": {"image": IMAGE}},
       "spec.identityRef: is required: a cluster's Jobs run with the credentials of a TerraformClusterIdentity",
       "cluster-identity")
EP1 = {"host": "10.0.0.1", "port": 6443}
single("cluster", "endpoint-immutable", "TerraformCluster", cluster(controlPlaneEndpoint={"host": "10.0.0.2", "port": 6443}),
       "spec.controlPlaneEndpoint: is immutable once its host is set (was 10.0.0.1:6443) (got 10.0.0.2:6443)",
       "cluster-endpoint", op="UPDATE", old_spec=cluster(controlPlaneEndpoint=EP1))
single("cluster", "endpoint-set-once", "TerraformCluster", cluster(controlPlaneEndpoint=EP1), None,
       "cluster-endpoint-set", op="UPDATE", old_spec=cluster())
MACHINE_RULE = "is immutable: a machine is re-created, never re-applied with other inputs"
single("machine", "source-immutable", "TerraformMachine", {"source": {"image": IMAGE.replace("v0.1.0", "v0.2.0")}},
       f"spec.source: {MACHINE_RULE}", "machine-source", op="UPDATE", old_spec=machine())
single("machine", "identity-unset-to-set", "TerraformMachine", machine(identityRef={"name": "creds"}),
       f"spec.identityRef: {MACHINE_RULE}", "machine-identity", op="UPDATE", old_spec=machine())
single("machine", "jobs-mutable", "TerraformMachine", machine(jobs={"lockTimeoutSeconds": 60}), None,
       "machine-jobs", op="UPDATE", old_spec=machine())
single("machine", "provider-id-first-set", "TerraformMachine", machine(providerID="aws:///i-1"), None,
       "machine-pid-set", op="UPDATE", old_spec=machine())
single("machine", "provider-id-changed", "TerraformMachine", machine(providerID="aws:///i-2"),
       'spec.providerID: may be set once and then never change (was "aws:///i-1") (got "aws:///i-2")',
       "machine-pid-changed", op="UPDATE", old_spec=machine(providerID="aws:///i-1"))
single("machine", "pool-everything-mutable", "TerraformMachinePool",
       {"source": {"image": IMAGE.replace("v0.1.0", "v0.2.0")}, "providerID": "aws:///asg-2"}, None,
       "pool-mutable", op="UPDATE", old_spec=machine(providerID="aws:///asg-1"))
# A machine stored without the defaults (created while the webhooks were not
# registered, or by an older version) reads as defaulted, as the API server
# reads a CRD's schema defaults: the defaults the mutating webhook adds on its
# next update (the manager's finalizer patch, say) change nothing. Leaving a
# default out changes nothing either; another value still does.
single("machine", "defaults-added-on-update", "TerraformMachine",
       machine(source={"image": IMAGE, "imagePullPolicy": "IfNotPresent"},
               variablesFrom=[{"configMapRef": {"name": "vars"}, "optional": False, "format": "String"}]),
       None, "machine-defaulted", op="UPDATE", old_spec=machine(variablesFrom=[{"configMapRef": {"name": "vars"}}]))
single("machine", "default-left-out-on-update", "TerraformMachine", machine(), None, "machine-default-left-out",
       op="UPDATE", old_spec=machine(source={"image": IMAGE, "imagePullPolicy": "IfNotPresent"}))
single("machine", "pull-policy-set-over-unset", "TerraformMachine",
       machine(source={"image": IMAGE, "imagePullPolicy": "Always"}), f"spec.source: {MACHINE_RULE}",
       "machine-pull-policy", op="UPDATE", old_spec=machine())
single("machine", "variables-from-format-set-over-unset", "TerraformMachine",
       machine(variablesFrom=[{"configMapRef": {"name": "vars"}, "format": "JSON"}]),
       f"spec.variablesFrom: {MACHINE_RULE}", "machine-vf-format", op="UPDATE",
       old_spec=machine(variablesFrom=[{"configMapRef": {"name": "vars"}}]))
TEMPLATE_RULE = ("spec.template.spec: is immutable after creation: create a new template and point the "
                 "ClusterClass or MachineDeployment at it")
single("template", "spec-changed", "TerraformMachineTemplate",
       template({"source": {"image": IMAGE.replace("v0.1.0", "v0.2.0")}}), TEMPLATE_RULE, "tmpl-changed",
       op="UPDATE", old_spec=template(machine()))
single("template", "spec-changed-dry-run", "TerraformMachineTemplate",
       template({"source": {"image": IMAGE.replace("v0.1.0", "v0.2.0")}}), None, "tmpl-dry-run",
       op="UPDATE", old_spec=template(machine()), dry_run=True)
single("template", "metadata-changed", "TerraformClusterTemplate",
       {"template": {"metadata": {"labels": {"team": "b"}}, "spec": cluster()}}, None, "tmpl-meta",
       op="UPDATE", old_spec={"template": {"metadata": {"labels": {"team": "a"}}, "spec": cluster()}})
single("identity", "allowed-namespaces-empty", "TerraformClusterIdentity",
       {"secretRef": {"name": "creds", "namespace": "captf-system"}, "allowedNamespaces": {}},
       "spec.allowedNamespaces: must set list, selector or both (selector: {} allows every namespace; "
       "omit the field to allow none) (got {})", "identity-empty", op="UPDATE",
       old_spec={"secretRef": {"name": "creds", "namespace": "captf-system"}})

# Deletion rules (ref §1.4 rules 10 and 12). The outcomes that need the API
# server (the owning Machine, the objects using an identity, the creator's
# SubjectAccessReview) are tested through the real API server in
# tests/webhooks.rs; these two need no lookup.
mirrored = obj("TerraformClusterIdentity", {"secretRef": {"name": "creds", "namespace": "captf-system"}},
               name="creds", status={"namespaces": ["demo", "team-b"]})
case("identity", "delete-while-mirrored", "validate", review("identity-mirrored", "DELETE", None, mirrored),
     denied("identity-mirrored", 'metadata.name: cannot be deleted while namespaces hold its credentials mirror: '
            'demo, team-b (got "creds")', code=403))
case("machine", "delete-without-machine-owner", "validate",
     review("machine-no-owner", "DELETE", None, obj("TerraformMachine", machine())), allowed("machine-no-owner"))

# Rule 4: TF_ and KUBE_ env entries are accepted with a warning naming each.
uid = "env-warn"
case("jobs-env", "reserved-names-warned", "validate",
     review(uid, "CREATE", obj("TerraformMachine", machine(jobs={"env": [
         {"name": "TF_LOG", "value": "DEBUG"}, {"name": "REGION", "value": "eu"},
         {"name": "KUBE_CONFIG", "value": "/x"}]}))),
     allowed(uid, warnings=[
         'spec.jobs.env[0].name: "TF_LOG" begins with TF_ or KUBE_ and is dropped: the Job never receives it',
         'spec.jobs.env[2].name: "KUBE_CONFIG" begins with TF_ or KUBE_ and is dropped: the Job never receives it']))

# Defaulting: exactly the CONTRACT's defaults, and nothing on a second pass.
def add(path, value):
    return {"op": "add", "path": path, "value": value}

uid = "default-machine"
case("defaults", "machine", "mutate",
     review(uid, "CREATE", obj("TerraformMachine", machine(variablesFrom=[{"configMapRef": {"name": "vars"}}]))),
     allowed(uid, patch=[add("/spec/source/imagePullPolicy", "IfNotPresent"),
                         add("/spec/variablesFrom/0/optional", False),
                         add("/spec/variablesFrom/0/format", "String")]))
uid = "default-cluster"
case("defaults", "cluster", "mutate", review(uid, "CREATE", obj("TerraformCluster", cluster())),
     allowed(uid, patch=[add("/spec/source/imagePullPolicy", "IfNotPresent"), add("/spec/applyPolicy", "Automatic"),
                         add("/spec/drift", {"action": "Report"})]))
uid = "default-pool"
case("defaults", "pool-with-drift-interval", "mutate",
     review(uid, "CREATE", obj("TerraformMachinePool", machine(drift={"intervalSeconds": 600}))),
     allowed(uid, patch=[add("/spec/source/imagePullPolicy", "IfNotPresent"), add("/spec/drift/action", "Report")]))
uid = "default-machine-update"
stored = obj("TerraformMachine", machine())
updated = copy.deepcopy(stored); updated["metadata"]["finalizers"] = ["terraformmachine.infrastructure.cluster.x-k8s.io"]
case("defaults", "machine-stored-without-defaults-updated", "mutate", review(uid, "UPDATE", updated, stored),
     allowed(uid, patch=[add("/spec/source/imagePullPolicy", "IfNotPresent")]))
uid = "default-again"
case("defaults", "already-defaulted", "mutate",
     review(uid, "UPDATE", obj("TerraformCluster", cluster(source={"image": IMAGE, "imagePullPolicy": "IfNotPresent"},
                                                           applyPolicy="Automatic", drift={"action": "Report"}))),
     allowed(uid))
uid = "default-template"
case("defaults", "template-untouched", "mutate",
     review(uid, "CREATE", obj("TerraformMachineTemplate", template(machine()))), allowed(uid))


def main():
    for entry in os.listdir(HERE):
        if os.path.isdir(os.path.join(HERE, entry)):
            shutil.rmtree(os.path.join(HERE, entry))
    for rule, cases in CASES.items():
        os.makedirs(os.path.join(HERE, rule))
        for name, hook, request, response in cases:
            for suffix, doc in (("request", request), ("response", response)):
                path = os.path.join(HERE, rule, f"{name}.{hook}.{suffix}.json")
                with open(path, "w") as f:
                    json.dump(doc, f, indent=2, sort_keys=True)
                    f.write("\n")
    print(f"{sum(len(c) for c in CASES.values())} cases in {len(CASES)} rules")


main()
