{{- define "captf.labels" -}}
app.kubernetes.io/name: captf
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
cluster.x-k8s.io/provider: infrastructure-terraform
{{- end }}

{{- define "captf.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end }}
