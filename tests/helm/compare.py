#!/usr/bin/env python3
"""Compares two rendered YAML streams object by object (apiVersion, kind, namespace,
name), ignoring the labels Helm adds and nothing else. Exits 1 on any difference.

usage: compare.py KUSTOMIZE.yaml HELM.yaml [--missing KIND/NAME]... [--extra-hooks]
  --missing KIND/NAME  an object of the first stream allowed to be absent from the second
  --extra-hooks        objects of the second stream that are Helm hooks are not compared
"""
import difflib
import sys

import yaml

HELM_LABELS = {
    "helm.sh/chart",
    "app.kubernetes.io/instance",
    "app.kubernetes.io/version",
    "app.kubernetes.io/managed-by",
}


def load(path):
    with open(path) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    return docs


def key(doc):
    meta = doc.get("metadata") or {}
    return (doc.get("apiVersion"), doc.get("kind"), meta.get("namespace", ""), meta.get("name"))


def strip_helm_labels(node):
    """Drops Helm's labels from every `metadata.labels` in the object (pod templates too)."""
    if isinstance(node, dict):
        meta = node.get("metadata")
        if isinstance(meta, dict) and isinstance(meta.get("labels"), dict):
            for k in HELM_LABELS:
                meta["labels"].pop(k, None)
        for v in node.values():
            strip_helm_labels(v)
    elif isinstance(node, list):
        for v in node:
            strip_helm_labels(v)
    return node


def main(argv):
    args = argv[1:]
    missing, extra_hooks, files = set(), False, []
    while args:
        a = args.pop(0)
        if a == "--missing":
            missing.add(args.pop(0))
        elif a == "--extra-hooks":
            extra_hooks = True
        else:
            files.append(a)
    if len(files) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    first = {key(d): strip_helm_labels(d) for d in load(files[0])}
    second = {}
    for d in load(files[1]):
        if extra_hooks and "helm.sh/hook" in ((d.get("metadata") or {}).get("annotations") or {}):
            continue
        second[key(d)] = strip_helm_labels(d)
    failures = 0
    for k in sorted(set(first) | set(second), key=str):
        name = f"{k[1]}/{k[3]}" + (f" in {k[2]}" if k[2] else "")
        if k not in second:
            if f"{k[1]}/{k[3]}" in missing:
                print(f"compare: ok   {name}: absent from {files[1]}, as allowed")
                continue
            print(f"compare: FAIL {name}: only in {files[0]}")
            failures += 1
        elif k not in first:
            print(f"compare: FAIL {name}: only in {files[1]}")
            failures += 1
        elif first[k] != second[k]:
            a = yaml.safe_dump(first[k], sort_keys=True).splitlines()
            b = yaml.safe_dump(second[k], sort_keys=True).splitlines()
            print(f"compare: FAIL {name} differs:")
            for line in difflib.unified_diff(a, b, files[0], files[1], lineterm="", n=2):
                print("    " + line)
            failures += 1
        else:
            print(f"compare: ok   {name}")
    print(f"compare: {len(first)} vs {len(second)} objects, {failures} differ")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
