"""Validates every manifest under deploy/kubernetes offline.

Built-in kinds are checked by kubernetes-validate (strict: unknown fields are errors)
against the schemas it bundles, for the oldest and the newest Kubernetes version the base
supports. Custom resources (the Prometheus operator's ServiceMonitor) are checked against
the JSON Schemas in deploy/kubernetes/schemas/; a kind with no schema at all is an error,
never a silent pass. The kustomization must list files that exist.

Usage: validate_kubernetes.py DIR   (exit 0: valid; 1: the problems are printed)
       validate_kubernetes.py --config DIR   (prints the snakecage.toml of the ConfigMap)
"""

import json
import pathlib
import sys
import tomllib

import jsonschema
import kubernetes_validate
import yaml

VERSIONS = ("1.33.0", "1.37.0")
KUSTOMIZATION = "kustomization.yaml"


def custom_schemas(root):
    schemas = {}
    for path in sorted((root / "schemas").glob("*.json")):
        schema = json.loads(path.read_text())
        props = schema["properties"]
        schemas[(props["apiVersion"]["const"], props["kind"]["const"])] = schema
    return schemas


def documents(root):
    for path in sorted(root.rglob("*.yaml")):
        if path.name == KUSTOMIZATION:
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                yield path, doc


def problems(root):
    found = []
    kustomization = yaml.safe_load((root / KUSTOMIZATION).read_text())
    for resource in kustomization.get("resources", []):
        if not (root / resource).is_file():
            found.append(f"{KUSTOMIZATION}: resource {resource} does not exist")
    schemas = custom_schemas(root)
    count = 0
    for path, doc in documents(root):
        count += 1
        name = f"{path.relative_to(root)}: {doc.get('kind')} {doc.get('metadata', {}).get('name')}"
        key = (doc.get("apiVersion"), doc.get("kind"))
        if key in schemas:
            errors = list(jsonschema.Draft7Validator(schemas[key]).iter_errors(doc))
            found.extend(f"{name}: {e.message} at {list(e.absolute_path)}" for e in errors)
            continue
        for version in VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.SchemaNotFoundError:
                found.append(f"{name}: no schema for {key} (add one to schemas/)")
                break
            except kubernetes_validate.ValidationError as e:
                found.append(f"{name}: Kubernetes {version}: {e.message} at {list(e.path)}")
    if count == 0:
        found.append("no manifests found")
    found.extend(shutdown_problems(root))
    return found


def shutdown_problems(root):
    """The pod's grace period must cover preStop, the drain and the in-flight grace."""
    config = yaml.safe_load((root / "configmap.yaml").read_text())
    worker = tomllib.loads(config["data"]["snakecage.toml"]).get("worker", {})
    pod = yaml.safe_load((root / "statefulset.yaml").read_text())["spec"]["template"]["spec"]
    container = pod["containers"][0]
    pre_stop = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    needed = pre_stop + (worker.get("shutdown_drain_ms", 0) + worker.get("shutdown_grace_ms", 10000)) / 1000
    granted = pod["terminationGracePeriodSeconds"]
    if granted < needed:
        return [f"terminationGracePeriodSeconds {granted} < preStop + drain + grace = {needed}"]
    return []


def main(argv):
    if len(argv) == 3 and argv[1] == "--config":
        root = pathlib.Path(argv[2])
        config = yaml.safe_load((root / "configmap.yaml").read_text())
        sys.stdout.write(config["data"]["snakecage.toml"])
        return 0
    root = pathlib.Path(argv[1])
    found = problems(root)
    for problem in found:
        print(problem)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
