-- Argo CD health check for apps/StatefulSet that knows churn-throttler
-- (argocd-cm: resource.customizations.health.apps_StatefulSet; docs/partition.md).
--
-- While churn-throttler holds a rollout (the churn-throttler.io/partition-target
-- annotation is present), the StatefulSet is Progressing: the built-in check counts a
-- partitioned rollout as done once the pods above the partition are updated, which is
-- at once while the partition is held at `replicas`. The releaser removes the annotation
-- when the partition has reached the target and the last re-created pod is Ready.
-- Otherwise: the built-in logic (kubectl rollout status), which never says Degraded.
local hs = {}
local meta = obj.metadata or {}
local annotations = meta.annotations or {}
local spec = obj.spec or {}
local status = obj.status or {}
local strategy = spec.updateStrategy or {}
local rolling = strategy.rollingUpdate
local updated = status.updatedReplicas or 0
local ready = status.readyReplicas or 0

local target = annotations["churn-throttler.io/partition-target"]
if target ~= nil then
  local partition = 0
  if rolling ~= nil and rolling.partition ~= nil then
    partition = rolling.partition
  end
  local replicas = spec.replicas or 1
  hs.status = "Progressing"
  hs.message = string.format(
    "churn-throttler holds this rollout at partition %d and lowers it to %s one pod at a time (rule %s); %d of %d pods updated, %d ready",
    partition, target, annotations["churn-throttler.io/paced-by"] or "?", updated, replicas, ready)
  return hs
end

if (status.observedGeneration or 0) == 0 or (meta.generation or 0) > status.observedGeneration then
  hs.status = "Progressing"
  hs.message = "Waiting for statefulset spec update to be observed..."
  return hs
end
if spec.replicas ~= nil and ready < spec.replicas then
  hs.status = "Progressing"
  hs.message = string.format("Waiting for %d pods to be ready...", spec.replicas - ready)
  return hs
end
if strategy.type == "RollingUpdate" and rolling ~= nil then
  if spec.replicas ~= nil and rolling.partition ~= nil and updated < spec.replicas - rolling.partition then
    hs.status = "Progressing"
    hs.message = string.format(
      "Waiting for partitioned roll out to finish: %d out of %d new pods have been updated...",
      updated, spec.replicas - rolling.partition)
    return hs
  end
  hs.status = "Healthy"
  hs.message = string.format("partitioned roll out complete: %d new pods have been updated...", updated)
  return hs
end
if strategy.type == "OnDelete" then
  hs.status = "Healthy"
  hs.message = string.format("statefulset has %d ready pods", ready)
  return hs
end
if status.updateRevision ~= status.currentRevision then
  hs.status = "Progressing"
  hs.message = string.format("waiting for statefulset rolling update to complete %d pods at revision %s...",
    updated, tostring(status.updateRevision))
  return hs
end
hs.status = "Healthy"
hs.message = string.format("statefulset rolling update complete %d pods at revision %s...",
  status.currentReplicas or 0, tostring(status.currentRevision))
return hs
