{{/* Labels on every object: the name manifests/base uses, plus Helm's own. */}}
{{- define "churn-throttler.labels" -}}
app.kubernetes.io/name: churn-throttler
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{/* The webhook pods' labels, also their selector: fixed, as in manifests/base. */}}
{{- define "churn-throttler.selectorLabels" -}}
app.kubernetes.io/name: churn-throttler
app.kubernetes.io/component: webhook
{{- end -}}

{{/* The policy, parsed; rendering stops with a clear error on bad input. */}}
{{- define "churn-throttler.policy" -}}
{{- $policy := fromYaml .Values.policy -}}
{{- if hasKey $policy "Error" -}}
{{- fail (printf "values.policy is not YAML: %s" $policy.Error) -}}
{{- end -}}
{{- toJson $policy -}}
{{- end -}}

{{/* Checks that hold for every object; included once, by the Deployment. */}}
{{- define "churn-throttler.checks" -}}
{{- if ne .Release.Namespace "churn-throttler" -}}
{{- fail (printf "install into the namespace churn-throttler (got %q): the policy exempts it and its ServiceAccount by name" .Release.Namespace) -}}
{{- end -}}
{{- $policy := include "churn-throttler.policy" . | fromJson -}}
{{- $timeout := $policy.timeoutSeconds | default 10 | int -}}
{{- if ne $timeout (int .Values.webhooks.timeoutSeconds) -}}
{{- fail (printf "webhooks.timeoutSeconds (%v) must equal timeoutSeconds in values.policy (%v): the server derives its deadline and longest hold from it" .Values.webhooks.timeoutSeconds $timeout) -}}
{{- end -}}
{{- end -}}

{{/* matchConditions of both webhooks: skip the kubelet and the policy's exempt users. */}}
{{- define "churn-throttler.matchConditions" -}}
{{- $policy := include "churn-throttler.policy" . | fromJson -}}
{{- $users := list -}}
{{- if and $policy.exempt $policy.exempt.users -}}
{{- $users = $policy.exempt.users -}}
{{- end -}}
{{- $conditions := list -}}
{{- if .Values.webhooks.skipNodes -}}
{{- $conditions = append $conditions (dict "name" "not-from-a-node" "expression" "!('system:nodes' in request.userInfo.groups)") -}}
{{- end -}}
{{- if and .Values.webhooks.skipExemptUsers $users -}}
{{- $quoted := list -}}
{{- range $users -}}
{{- if contains "'" . -}}
{{- fail (printf "exempt user %q contains a quote" .) -}}
{{- end -}}
{{- $quoted = append $quoted (printf "'%s'" .) -}}
{{- end -}}
{{- $conditions = append $conditions (dict "name" "not-from-an-exempt-user" "expression" (printf "!(request.userInfo.username in [%s])" (join ", " $quoted))) -}}
{{- end -}}
{{- $conditions = concat $conditions .Values.webhooks.extraMatchConditions -}}
{{- if $conditions -}}
matchConditions:
{{- range $conditions }}
  - name: {{ .name }}
    expression: {{ .expression | quote }}
{{- end }}
{{- end -}}
{{- end -}}

{{/* The webhook configurations' common part. */}}
{{- define "churn-throttler.webhookCommon" -}}
failurePolicy: {{ .Values.webhooks.failurePolicy }}
matchPolicy: Equivalent
sideEffects: NoneOnDryRun
timeoutSeconds: {{ .Values.webhooks.timeoutSeconds }}
namespaceSelector:
  matchLabels:
    {{ .Values.webhooks.optInLabel.key }}: {{ .Values.webhooks.optInLabel.value | quote }}
  matchExpressions:
    - key: kubernetes.io/metadata.name
      operator: NotIn
      values: {{ prepend .Values.webhooks.excludeNamespaces .Release.Namespace | uniq | toJson }}
{{ include "churn-throttler.matchConditions" . }}
{{- end -}}

{{/* clientConfig of a webhook; the argument is (dict "root" $ "path" "/validate" "caBundle" "..."). */}}
{{- define "churn-throttler.clientConfig" -}}
clientConfig:
  service:
    name: churn-throttler
    namespace: {{ .root.Release.Namespace }}
    path: {{ .path }}
    port: 443
{{- with .caBundle }}
  caBundle: {{ . }}
{{- end }}
{{- end -}}
