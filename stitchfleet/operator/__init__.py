"""The Kubernetes side: kopf operator, admission webhook, fleet rollups.

Depends on telemetry only; kopf and kubernetes are imported lazily here and nowhere else.
"""
