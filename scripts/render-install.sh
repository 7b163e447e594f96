#!/usr/bin/env bash
# Regenerates everything under charts/ and manifests/ that is derived from other
# files (operator/tests/install.rs fails when one of them has drifted):
#   charts/mailcluster/crds/   <- crds/ (itself from `mailcluster crd`)
#   manifests/install.yaml     <- the chart with default values, plus Namespace and CRD
#   manifests/install-cluster-wide.yaml <- the same with clusterWide=true
#   manifests/argocd/argocd-cm.yaml <- the Argo CD health script
# Needs python3 with helm-python-sdk (Helm as a library: no helm binary, no network).
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -c 'import helm_python, yaml' 2>/dev/null || python3 -m pip install -q helm-python-sdk pyyaml
rm -f charts/mailcluster/crds/*.yaml
cp crds/*.yaml charts/mailcluster/crds/
python3 scripts/install_checks.py render-install > manifests/install.yaml.tmp
mv manifests/install.yaml.tmp manifests/install.yaml
python3 scripts/install_checks.py render-install-cluster-wide > manifests/install-cluster-wide.yaml.tmp
mv manifests/install-cluster-wide.yaml.tmp manifests/install-cluster-wide.yaml
python3 scripts/install_checks.py render-argocd-cm > manifests/argocd/argocd-cm.yaml.tmp
mv manifests/argocd/argocd-cm.yaml.tmp manifests/argocd/argocd-cm.yaml
echo "rendered manifests/install.yaml, manifests/install-cluster-wide.yaml, manifests/argocd/argocd-cm.yaml, charts/mailcluster/crds/"
