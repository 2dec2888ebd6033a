{{/* Chart name, truncated to the 63 characters a label allows. */}}
{{- define "chunkpilot.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Fully qualified name of the release's objects. */}}
{{- define "chunkpilot.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else if contains (include "chunkpilot.name" .) .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name (include "chunkpilot.name" .) | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}

{{- define "chunkpilot.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "chunkpilot.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: chunkpilot
{{- end }}

{{- define "chunkpilot.selectorLabels" -}}
app.kubernetes.io/name: {{ include "chunkpilot.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "chunkpilot.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "chunkpilot.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* Several replicas act safely only with peering: refuse replicaCount > 1 without it. */}}
{{- define "chunkpilot.peered" -}}
{{- if gt (int .Values.replicaCount) 1 }}
{{- if not .Values.peering.enabled }}
{{- fail (printf "replicaCount is %d but peering.enabled is false: every replica would act on every object; set peering.enabled=true or replicaCount=1" (int .Values.replicaCount)) }}
{{- end }}true
{{- end }}
{{- end }}

{{/* Namespaces the namespaced mode watches (validated). */}}
{{- define "chunkpilot.watchedNamespaces" -}}
{{- if and (eq .Values.watch.mode "namespaced") (empty .Values.watch.namespaces) }}
{{- fail "watch.namespaces must list at least one namespace when watch.mode is namespaced" }}
{{- end }}
{{- join "," .Values.watch.namespaces }}
{{- end }}

{{/* Permissions the operator (and the autotuner running in it) needs in a namespace. No wildcards.
Each rule is a call listed in chunkpilot.operator.apicalls.API_CALLS (tests/operator/test_rbac.py
fails on a call without a rule and on a rule without a call). */}}
{{- define "chunkpilot.namespacedRules" -}}
- apiGroups: ["chunkpilot.io"]
  resources: ["inferenceservices"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["chunkpilot.io"]
  resources: ["inferenceservices/status"]
  verbs: ["patch"]
# Children carry ownerReferences with blockOwnerDeletion.
- apiGroups: ["chunkpilot.io"]
  resources: ["inferenceservices/finalizers"]
  verbs: ["update"]
- apiGroups: ["chunkpilot.io"]
  resources: ["tuningtrials"]
  verbs: ["list", "watch", "create", "patch"]
- apiGroups: ["chunkpilot.io"]
  resources: ["tuningtrials/status"]
  verbs: ["patch"]
- apiGroups: ["apps"]
  resources: ["deployments"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["services"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["monitoring.coreos.com"]
  resources: ["podmonitors"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: ["networking.k8s.io"]
  resources: ["networkpolicies"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
# The autotuner lists a service's canary pods (crash detection; the Ready ones to live-adjust).
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["list"]
{{- if .Values.liveAdjust.enabled }}
# Live adjustment (liveAdjust.enabled): one Secret per namespace, chunkpilot-live-adjust, holds a
# token per track of each service with autotune.liveAdjust; the operator creates it and adds tokens,
# the autotuner reads the canary's. Reading and patching are limited to that name; create cannot be
# limited by name (it reveals no Secret).
- apiGroups: [""]
  resources: ["secrets"]
  verbs: ["create"]
- apiGroups: [""]
  resources: ["secrets"]
  resourceNames: ["chunkpilot-live-adjust"]
  verbs: ["get", "patch"]
# The canary's ReplicaSets: the token goes only to pods whose owner chain ends at the canary.
- apiGroups: ["apps"]
  resources: ["replicasets"]
  verbs: ["list"]
{{- end }}
{{- if .Values.disaggregation.enabled }}
# Disaggregated services (disaggregation.enabled): each one's router gets a ServiceAccount and a
# Role that reads the namespace's pods; the operator can only grant that read access while holding
# it. The PodMonitors a topology change leaves are deleted, and so is a topology trial's canary
# router (autotune.allowTopologyChange) with its verdict.
- apiGroups: [""]
  resources: ["pods"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "create", "patch", "delete"]
- apiGroups: ["monitoring.coreos.com"]
  resources: ["podmonitors"]
  verbs: ["delete"]
{{- end }}
{{- if .Values.twinJobs.enabled }}
# Twin Jobs (twinJobs.enabled): rankings on the twin beyond the operator's CPU budget run as Jobs.
# The operator creates each Job (its request in the pod template) and reads the result its worker
# patches into it from its watch of them; each Job's Role lets the Jobs' ServiceAccount patch that
# one Job, which the operator can grant because it holds the verb. No ConfigMap or Secret is written.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "patch"]
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["get", "create"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["roles", "rolebindings"]
  verbs: ["get", "create"]
{{- end }}
{{- if .Values.probeJobs.enabled }}
# Probe Jobs (probeJobs.enabled): the Job, the profile ConfigMaps it publishes (read here), and the
# probe's ServiceAccount and RoleBinding to chunkpilot-probe-publisher, which the operator may bind
# (below, by name) without holding its ConfigMap writes.
- apiGroups: ["batch"]
  resources: ["jobs"]
  verbs: ["get", "list", "watch", "create", "delete"]
- apiGroups: [""]
  resources: ["configmaps"]
  verbs: ["get", "list", "watch"]
- apiGroups: [""]
  resources: ["serviceaccounts"]
  verbs: ["get", "create", "patch"]
- apiGroups: ["rbac.authorization.k8s.io"]
  resources: ["rolebindings"]
  verbs: ["get", "create", "patch"]
{{- end }}
{{- end }}

{{/* PodMonitor labels as key=value,... for CHUNKPILOT_POD_MONITOR_LABELS. */}}
{{- define "chunkpilot.podMonitorLabels" -}}
{{- $pairs := list }}
{{- range $key, $value := .Values.podMonitor.labels }}
{{- $pairs = append $pairs (printf "%s=%s" $key $value) }}
{{- end }}
{{- join "," $pairs }}
{{- end }}

{{/* A label map as key=value,... (CHUNKPILOT_PROMETHEUS_NAMESPACE_LABELS). */}}
{{- define "chunkpilot.labelList" -}}
{{- $pairs := list }}
{{- range $key, $value := . }}
{{- $pairs = append $pairs (printf "%s=%s" $key $value) }}
{{- end }}
{{- join "," $pairs }}
{{- end }}
