#!/usr/bin/env python3
"""Offline check of deploy/kubernetes/*.yaml: each file parses (python3-yaml),
and each object matches a schema of the fields these manifests use, written
here: known apiVersion/kind pairs, no unknown or misspelt field, the right
types, selectors that match the pod template, volume mounts that name a
volume, absolute host paths, probes that run a command. Debian has no
Kubernetes schema validator (kubeconform, kubeval: not packaged), so this is
the subset that matters for these files; it also refuses what a real API
server would.

    check_manifests.py DIR
"""
import os
import sys

import yaml

S, I, B = str, int, bool
ANY_MAP = ("map", str)           # a map of strings to strings
LIST = lambda item: ("list", item)  # noqa: E731

EXEC = {"command": LIST(S)}
PROBE = {"exec": EXEC, "initialDelaySeconds": I, "periodSeconds": I, "timeoutSeconds": I,
         "failureThreshold": I, "successThreshold": I}
SECCTX_C = {"allowPrivilegeEscalation": B, "readOnlyRootFilesystem": B, "runAsUser": I,
            "runAsGroup": I, "runAsNonRoot": B, "privileged": B,
            "capabilities": {"drop": LIST(S), "add": LIST(S)}}
QUANTITIES = ("map", (str, int))  # 1, "100m", "1Gi"
RESOURCES = {"requests": QUANTITIES, "limits": QUANTITIES}
CONTAINER = {"name": S, "image": S, "command": LIST(S), "args": LIST(S),
             "env": LIST({"name": S, "value": S}), "securityContext": SECCTX_C,
             "readinessProbe": PROBE, "livenessProbe": PROBE, "startupProbe": PROBE,
             "resources": RESOURCES,
             "volumeMounts": LIST({"name": S, "mountPath": S, "readOnly": B, "subPath": S})}
VOLUME = {"name": S, "hostPath": {"path": S, "type": S}, "configMap": {"name": S},
          "emptyDir": {}}
POD_SPEC = {"hostPID": B, "hostIPC": B, "hostNetwork": B, "runtimeClassName": S,
            "nodeSelector": ANY_MAP, "restartPolicy": S, "terminationGracePeriodSeconds": I,
            "securityContext": {"runAsUser": I, "runAsGroup": I, "runAsNonRoot": B,
                                "supplementalGroups": LIST(I), "fsGroup": I,
                                "seccompProfile": {"type": S}},
            "initContainers": LIST(CONTAINER), "containers": LIST(CONTAINER),
            "volumes": LIST(VOLUME)}
META = {"name": S, "namespace": S, "labels": ANY_MAP, "annotations": ANY_MAP}
SCHEMAS = {
    ("v1", "Namespace"): {"metadata": META},
    ("v1", "ConfigMap"): {"metadata": META, "data": ANY_MAP},
    ("v1", "Pod"): {"metadata": META, "spec": POD_SPEC},
    ("apps/v1", "DaemonSet"): {"metadata": META, "spec": {
        "selector": {"matchLabels": ANY_MAP},
        "updateStrategy": {"type": S, "rollingUpdate": {"maxSurge": I, "maxUnavailable": I}},
        "minReadySeconds": I,
        "template": {"metadata": META, "spec": POD_SPEC}}},
}
REQUIRED = {"metadata": ["name"], "container": ["name", "image"], "volume": ["name"]}
HOSTPATH_TYPES = {"", "DirectoryOrCreate", "Directory", "FileOrCreate", "File", "Socket"}


def check(node, schema, where, errors):
    if isinstance(schema, tuple) and schema[0] == "map":
        if not isinstance(node, dict) or not all(
                isinstance(k, str) and isinstance(v, schema[1]) for k, v in node.items()):
            errors.append(f"{where}: expected a map of strings to {schema[1]}")
    elif isinstance(schema, tuple) and schema[0] == "list":
        if not isinstance(node, list):
            errors.append(f"{where}: expected a list")
            return
        for i, item in enumerate(node):
            check(item, schema[1], f"{where}[{i}]", errors)
    elif isinstance(schema, dict):
        if not isinstance(node, dict):
            errors.append(f"{where}: expected a map")
            return
        for k, v in node.items():
            if k not in schema:
                errors.append(f"{where}: unknown field '{k}'")
            else:
                check(v, schema[k], f"{where}.{k}", errors)
    elif schema is I:
        if not isinstance(node, int) or isinstance(node, bool):
            errors.append(f"{where}: expected an integer")
    elif not isinstance(node, schema):
        errors.append(f"{where}: expected {schema.__name__}")


def semantics(obj, where, errors):
    kind = obj.get("kind")
    if not obj.get("metadata", {}).get("name"):
        errors.append(f"{where}: metadata.name missing")
    spec = obj.get("spec", {})
    pod = {"DaemonSet": spec.get("template", {}).get("spec"), "Pod": spec}.get(kind)
    if kind == "DaemonSet":
        want = spec.get("selector", {}).get("matchLabels", {})
        have = spec.get("template", {}).get("metadata", {}).get("labels", {})
        if not want or any(have.get(k) != v for k, v in want.items()):
            errors.append(f"{where}: spec.selector.matchLabels does not match the template's labels")
    if pod is None:
        return
    if not pod.get("containers"):
        errors.append(f"{where}: no containers")
    vols = {v.get("name") for v in pod.get("volumes", [])}
    for v in pod.get("volumes", []):
        hp = v.get("hostPath")
        if hp is not None and (not hp.get("path", "").startswith("/")
                               or hp.get("type", "") not in HOSTPATH_TYPES):
            errors.append(f"{where}: volume {v.get('name')}: hostPath needs an absolute path "
                          f"and a known type")
    for c in pod.get("initContainers", []) + pod.get("containers", []):
        for f in REQUIRED["container"]:
            if not c.get(f):
                errors.append(f"{where}: a container without {f}")
        for m in c.get("volumeMounts", []):
            if m.get("name") not in vols:
                errors.append(f"{where}: container {c.get('name')} mounts unknown volume "
                              f"'{m.get('name')}'")
            if not str(m.get("mountPath", "")).startswith("/"):
                errors.append(f"{where}: container {c.get('name')}: mountPath must be absolute")
        for p in ("readinessProbe", "livenessProbe", "startupProbe"):
            if p in c and not c[p].get("exec", {}).get("command"):
                errors.append(f"{where}: container {c.get('name')}: {p} runs no command")


def main(folder):
    errors, n = [], 0
    files = sorted(f for f in os.listdir(folder) if f.endswith((".yaml", ".yml")))
    if not files:
        errors.append(f"{folder}: no manifests")
    for f in files:
        path = os.path.join(folder, f)
        try:
            docs = [d for d in yaml.safe_load_all(open(path)) if d is not None]
        except yaml.YAMLError as e:
            errors.append(f"{f}: does not parse: {e}")
            continue
        for i, d in enumerate(docs):
            where = f"{f}#{i} {d.get('kind', '?')}/{d.get('metadata', {}).get('name', '?')}"
            key = (d.get("apiVersion"), d.get("kind"))
            if key not in SCHEMAS:
                errors.append(f"{where}: unknown apiVersion/kind {key}")
                continue
            body = {k: v for k, v in d.items() if k not in ("apiVersion", "kind")}
            check(body, SCHEMAS[key], where, errors)
            semantics(d, where, errors)
            n += 1
    for e in errors:
        print("check_manifests:", e, file=sys.stderr)
    if errors:
        return 1
    print(f"check_manifests: {n} objects in {len(files)} files: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
