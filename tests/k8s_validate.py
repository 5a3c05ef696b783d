#!/usr/bin/python3
"""Validates examples/k8s offline (issue 16 item 3): every Kubernetes object
against the API's own JSON schemas (the kubernetes-validate package from
PyPI, which bundles them: strict, so an unknown field fails too), the
Kubeflow TFJob's structure and each of its pod templates as a PodSpec,
and what pstrain needs of them: the key Secret mounted 0400 without
fsGroup (pstrain refuses a group-readable key), [cluster] lists that name
the StatefulSets' pods under the headless Service, and a cluster.ini that
`pstrain check` accepts.

    build/pyvenv/bin/python tests/k8s_validate.py examples/k8s PSTRAIN [K8S_VERSION]
"""
import os
import subprocess
import sys
import tempfile

import kubernetes_validate
import yaml

errors = []


def fail(where, what):
    errors.append("%s: %s" % (where, what))


def check_schema(where, doc, version):
    try:
        kubernetes_validate.validate(doc, version, strict=True)
    except kubernetes_validate.ValidationError as e:
        fail(where, "%s at %s" % (e.message, "/".join(str(p) for p in e.path)))
    except kubernetes_validate.SchemaNotFoundError as e:
        fail(where, "no schema: %s" % e)


def check_pod_spec(where, spec, version):
    """A PodSpec as the schema and pstrain see it."""
    check_schema(where, {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"}, "spec": spec}, version)
    if (spec.get("securityContext") or {}).get("fsGroup") is not None:
        fail(where, "fsGroup makes the Secret's key group-readable, which pstrain refuses")
    for vol in spec.get("volumes", []):
        secret = vol.get("secret")
        if secret and secret.get("defaultMode") != 0o400:
            fail(where, "Secret volume %s: defaultMode %r, not 0400" % (vol["name"], secret.get("defaultMode")))
    for c in spec.get("containers", []):
        args = c.get("args", [])
        if not args or args[0] not in ("ps", "worker", "run"):
            fail(where, "container %s does not run pstrain ps|worker|run: %r" % (c.get("name"), args))


def check_tfjob(where, doc, version):
    if doc.get("apiVersion") != "kubeflow.org/v1":
        fail(where, "TFJob apiVersion %r, not kubeflow.org/v1" % doc.get("apiVersion"))
    specs = (doc.get("spec") or {}).get("tfReplicaSpecs") or {}
    if not {"PS", "Worker"} <= set(specs) and not {"PS", "Chief"} <= set(specs):
        fail(where, "tfReplicaSpecs needs PS and Chief or Worker, has %s" % sorted(specs))
    for kind, rs in specs.items():
        w = "%s %s" % (where, kind)
        if kind not in ("PS", "Chief", "Master", "Worker", "Evaluator"):
            fail(w, "not a TFJob replica type")
        if kind == "Evaluator":
            fail(w, "pstrain runs no evaluator task")
        if not isinstance(rs.get("replicas"), int) or rs["replicas"] < 1:
            fail(w, "replicas %r" % rs.get("replicas"))
        if kind in ("Chief", "Master") and rs.get("replicas") != 1:
            fail(w, "a TFJob has one chief")
        spec = ((rs.get("template") or {}).get("spec")) or {}
        names = [c.get("name") for c in spec.get("containers", [])]
        if "tensorflow" not in names:
            fail(w, "the operator sets TF_CONFIG in the container named tensorflow; containers %s" % names)
        check_pod_spec(w, spec, version)


def main():
    folder, pstrain = sys.argv[1], sys.argv[2]
    version = sys.argv[3] if len(sys.argv) > 3 else "1.29"
    docs = []
    for name in sorted(os.listdir(folder)):
        if name.endswith(".yaml"):
            with open(os.path.join(folder, name)) as f:
                for i, doc in enumerate(yaml.safe_load_all(f)):
                    if doc:
                        docs.append(("%s[%d] %s" % (name, i, doc.get("kind")), doc))
    kinds = {doc["kind"] for _, doc in docs}
    for need in ("ConfigMap", "Service", "StatefulSet", "TFJob"):
        if need not in kinds:
            fail(folder, "no %s" % need)
    sets, service, ini = {}, None, None
    for where, doc in docs:
        if doc["kind"] == "TFJob":
            check_tfjob(where, doc, version)
            continue
        check_schema(where, doc, version)
        if doc["kind"] == "StatefulSet":
            sets[doc["metadata"]["name"]] = doc
            check_pod_spec(where, doc["spec"]["template"]["spec"], version)
        elif doc["kind"] == "Service":
            service = doc
            if doc["spec"].get("clusterIP") != "None":
                fail(where, "the Service must be headless (clusterIP: None) for per-pod names")
        elif doc["kind"] == "ConfigMap":
            ini = doc["data"]["cluster.ini"]
    if service and ini is not None:
        svc = service["metadata"]["name"]
        for role, key in (("ps", "ps"), ("worker", "workers")):
            st = sets.get("pstrain-" + role)
            if not st:
                fail(folder, "no StatefulSet pstrain-%s" % role)
                continue
            if st["spec"].get("serviceName") != svc:
                fail(role, "serviceName %r, not the Service %r" % (st["spec"].get("serviceName"), svc))
            want = ", ".join("pstrain-%s-%d.%s:2222" % (role, k, svc) for k in range(st["spec"]["replicas"]))
            line = [l for l in ini.splitlines() if l.split("=")[0].strip() == key]
            got = line[0].split("=", 1)[1].strip() if line else None
            if got != want:
                fail("ConfigMap", "[cluster] %s = %r; the StatefulSet's pods are %r" % (key, got, want))
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "cluster.ini")
            with open(path, "w") as f:
                # The pods read the data from their volume at /data; here,
                # Debian's copy of the same files stands in for it.
                f.write(ini.replace("/data/fashion-mnist/", "/usr/share/datasets/fashion-mnist/"))
            r = subprocess.run([pstrain, "check", "--config", path], capture_output=True, text=True)
            if r.returncode != 0:
                fail("ConfigMap", "pstrain check refuses its cluster.ini: %s" % r.stderr.strip())
    for e in errors:
        print(e)
    print("%d objects checked against Kubernetes %s: %s" % (len(docs), version, "ok" if not errors else "%d problems" % len(errors)))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
