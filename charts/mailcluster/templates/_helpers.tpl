{{/* Release-scoped name of every object: "<release>-mailcluster" unless the release is already named so. */}}
{{- define "mailcluster.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "mailcluster.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "mailcluster.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Pod selector: only labels that never change over the life of the Deployment. */}}
{{- define "mailcluster.selectorLabels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}-operator
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "mailcluster.labels" -}}
{{ include "mailcluster.selectorLabels" . }}
app.kubernetes.io/component: operator
app.kubernetes.io/part-of: mailcluster
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "mailcluster.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag -}}
{{- if .Values.image.digest -}}
{{- printf "%s:%s@%s" .Values.image.repository $tag .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository $tag -}}
{{- end -}}
{{- end -}}

{{/* The namespace whose MailClusters a namespaced operator reconciles. */}}
{{- define "mailcluster.watchNamespace" -}}
{{- default .Release.Namespace .Values.watchNamespace -}}
{{- end -}}

{{/* --allowed-images: the values' list, else the operator's own repository. */}}
{{- define "mailcluster.allowedImages" -}}
{{- if .Values.allowedImages -}}
{{- join "," .Values.allowedImages -}}
{{- else -}}
{{- .Values.image.repository -}}
{{- end -}}
{{- end -}}
