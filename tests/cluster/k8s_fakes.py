"""Shared by the launcher tests: a one-cluster kubeconfig and dagster-k8s's client over fake APIs."""

KUBECONFIG = """\
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "https://cluster.example.invalid:6443"}}]
users: [{name: u, user: {token: "not-a-real-token"}}]
contexts: [{name: ctx, context: {cluster: c, user: u}}]
current-context: ctx
"""


def fake_dagster_k8s_client(batch_api, core_api=None):
    """A DagsterKubernetesClient that calls the given fakes and never sleeps."""
    from dagster_k8s.client import DagsterKubernetesClient

    return DagsterKubernetesClient(
        batch_api=batch_api, core_api=core_api, logger=lambda *a: None, sleeper=lambda s: None, timer=lambda: 0.0
    )
