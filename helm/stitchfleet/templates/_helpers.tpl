{{/* Names, labels and shared fragments of the stitchfleet chart. */}}

{{- define "stitchfleet.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* <release>-<chart> (the release name alone when it already contains the chart name), at most 63 characters. */}}
{{- define "stitchfleet.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "stitchfleet.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "stitchfleet.selectorLabels" -}}
app.kubernetes.io/name: {{ include "stitchfleet.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "stitchfleet.labels" -}}
helm.sh/chart: {{ include "stitchfleet.chart" . }}
{{ include "stitchfleet.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: stitchfleet
{{- end }}

{{/* Labels of one component; call with (dict "ctx" $ "component" "operator"). */}}
{{- define "stitchfleet.componentLabels" -}}
{{ include "stitchfleet.labels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "stitchfleet.componentSelector" -}}
{{ include "stitchfleet.selectorLabels" .ctx }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "stitchfleet.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "stitchfleet.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "stitchfleet.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{/* The init container image injected pods get: the operator's own image unless set. */}}
{{- define "stitchfleet.shimImage" -}}
{{- if .Values.shimImage.repository }}
{{- printf "%s:%s" .Values.shimImage.repository (default .Chart.AppVersion .Values.shimImage.tag) }}
{{- else }}
{{- include "stitchfleet.image" . }}
{{- end }}
{{- end }}

{{/*
<fullname>-<suffix>, the full name shortened so that the whole stays within max characters
(default 63, a DNS label); call with (dict "ctx" $ "suffix" "settings" "max" 63).
*/}}
{{- define "stitchfleet.suffixedName" -}}
{{- $room := sub (default 63 .max) (add1 (len .suffix)) | int }}
{{- printf "%s-%s" (include "stitchfleet.fullname" .ctx | trunc $room | trimSuffix "-") .suffix }}
{{- end }}

{{- define "stitchfleet.settingsName" -}}
{{- include "stitchfleet.suffixedName" (dict "ctx" . "suffix" "settings") }}
{{- end }}

{{- define "stitchfleet.tlsSecretName" -}}
{{- include "stitchfleet.suffixedName" (dict "ctx" . "suffix" "tls") }}
{{- end }}

{{/* The ConfigMap holding only the ingestion CA, one per namespace with opted-in pods (operator/ca_publisher.py). */}}
{{- define "stitchfleet.ingestCaName" -}}
{{- include "stitchfleet.suffixedName" (dict "ctx" . "suffix" "ingest-ca") }}
{{- end }}

{{- define "stitchfleet.issuerName" -}}
{{- include "stitchfleet.suffixedName" (dict "ctx" . "suffix" "selfsigned") }}
{{- end }}

{{/* At most 52: the StatefulSet's controller-revision-hash label is <name>-<10 characters>. */}}
{{- define "stitchfleet.postgresqlName" -}}
{{- include "stitchfleet.suffixedName" (dict "ctx" . "suffix" "postgresql" "max" 52) }}
{{- end }}

{{- define "stitchfleet.postgresqlHeadlessName" -}}
{{- include "stitchfleet.suffixedName" (dict "ctx" . "suffix" "postgresql-hl") }}
{{- end }}

{{/* A CronJob's Jobs append 11 characters to its name: it may have at most 52. */}}
{{- define "stitchfleet.reportName" -}}
{{- include "stitchfleet.suffixedName" (dict "ctx" . "suffix" "weekly-report" "max" 52) }}
{{- end }}

{{- define "stitchfleet.tlsDir" -}}
/etc/stitchfleet/tls
{{- end }}

{{- define "stitchfleet.stateDir" -}}
/var/lib/stitchfleet
{{- end }}

{{/* Pod-level security context shared by the operator and the report job. */}}
{{- define "stitchfleet.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
fsGroup: 10001
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{- define "stitchfleet.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
runAsNonRoot: true
privileged: false
capabilities:
  drop:
    - ALL
{{- end }}

{{/* STITCHFLEET_DB_URL from the DB Secret in the release namespace; call with (dict "ctx" $ "optional" true). */}}
{{- /*
"true" when the bundled PostgreSQL's password is generated: no password and no Secret of the user's.
The operator pod's init container then creates the Secret once (operator/password_secret.py); the
chart renders no password, so every render of the same values is the same (no `lookup`).
*/}}
{{- define "stitchfleet.generatedPassword" -}}
{{- $pg := .Values.postgresql -}}
{{- if and $pg.enabled (not $pg.existingSecret) (not $pg.password) }}true{{ end }}
{{- end }}

{{- /* The Secret holding the bundled PostgreSQL's password (key `password`). */}}
{{- define "stitchfleet.passwordSecretName" -}}
{{- .Values.postgresql.existingSecret | default (include "stitchfleet.postgresqlName" .) }}
{{- end }}

{{- define "stitchfleet.dbUrlEnv" -}}
{{- $values := .ctx.Values -}}
{{- if and $values.postgresql.enabled (or $values.postgresql.existingSecret (include "stitchfleet.generatedPassword" .ctx)) }}
{{- /* The password Secret (the user's, or the generated one); Kubernetes expands $(VAR) in a later variable's value. */}}
{{- $pg := $values.postgresql -}}
{{- $host := printf "%s.%s.svc.%s" (include "stitchfleet.postgresqlName" .ctx) .ctx.Release.Namespace $values.clusterDomain -}}
- name: PGPASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "stitchfleet.passwordSecretName" .ctx }}
      key: password
- name: STITCHFLEET_DB_URL
  value: {{ printf "postgresql+psycopg://%s:$(PGPASSWORD)@%s:5432/%s?sslmode=%s" $pg.username $host $pg.database $pg.sslmode | quote }}
{{- else }}
- name: STITCHFLEET_DB_URL
  valueFrom:
    secretKeyRef:
      name: {{ $values.database.secretName }}
      key: {{ $values.database.secretKey }}
      optional: {{ .optional }}
{{- end }}
{{- end }}
