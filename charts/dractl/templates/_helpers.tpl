{{/* The chart's name, and the prefix of every object's name: "<release>-dractl" unless overridden. */}}
{{- define "dractl.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "dractl.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Labels every object carries; "dractl.selectorLabels" with a component picks one component's pods. */}}
{{- define "dractl.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "dractl.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end }}

{{- define "dractl.selectorLabels" -}}
app.kubernetes.io/name: {{ include "dractl.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{/* The one image every mode runs; the tag defaults to the chart's appVersion. */}}
{{- define "dractl.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "dractl.controllerName" -}}
{{- printf "%s-controller" (include "dractl.fullname" .) }}
{{- end }}

{{- define "dractl.nodeAgentName" -}}
{{- printf "%s-node-agent" (include "dractl.fullname" .) }}
{{- end }}

{{/* The generated RBAC rules (files/rbac.yaml, from dractl/kube/access.py) of one component. */}}
{{- define "dractl.rbac" -}}
{{- $all := .root.Files.Get "files/rbac.yaml" | fromYaml }}
{{- if eq .component "nodeAgent" }}
{{- toYaml $all.nodeAgent }}
{{- else }}
{{- $key := .root.Values.controller.controllers | uniq | sortAlpha | join "," }}
{{- $rules := get $all.controller $key }}
{{- if not $rules }}
{{- fail (printf "controller.controllers: %s is not a set of controllers files/rbac.yaml has rules for (%s)" $key (keys $all.controller | sortAlpha | join "; ")) }}
{{- end }}
{{- toYaml $rules }}
{{- end }}
{{- end }}

{{/*
CEL that spells a JSON value the way the node agent's messages do (Python's repr: 'text', 5, True,
None) and names its type as they do (str, int, float, bool, list, dict, NoneType). The argument
is the CEL expression of the value.
*/}}
{{- define "dractl.cel.repr" -}}
(type({{ . }}) == string ? {{ include "dractl.cel.strrepr" . }} : type({{ . }}) == bool ? ({{ . }} ? "True" : "False") : type({{ . }}) == null_type ? "None" : type({{ . }}) == list ? "[...]" : type({{ . }}) == map ? "{...}" : string({{ . }}))
{{- end }}

{{- define "dractl.cel.typename" -}}
(type({{ . }}) == string ? "str" : type({{ . }}) == bool ? "bool" : type({{ . }}) == int ? "int" : type({{ . }}) == double ? "float" : type({{ . }}) == list ? "list" : type({{ . }}) == null_type ? "NoneType" : "dict")
{{- end }}

{{/* Python's truth of a JSON value: false for null, false, 0, "", [] and {} (the agent reads `x or {}`). */}}
{{- define "dractl.cel.falsy" -}}
(type({{ . }}) == null_type || (type({{ . }}) == bool && !{{ . }}) || (type({{ . }}) == int && {{ . }} == 0) || (type({{ . }}) == double && {{ . }} == 0.0) || (type({{ . }}) == string && {{ . }} == "") || (type({{ . }}) == list && size({{ . }}) == 0) || (type({{ . }}) == map && size({{ . }}) == 0))
{{- end }}

{{/*
The agent's strict object check (dractl/model/opaque.py `_object`) as CEL giving "" or
"<path>: <message>". Arguments: value (CEL), path (the field path, "" at the top), allowed (keys).
Of several unknown fields it names the first in sorted order (kubectl sends keys sorted).
*/}}
{{- define "dractl.cel.object" -}}
{{- $path := ternary (printf ".%s" .path) "" (ne .path "") }}
{{- $allowed := .allowed | sortAlpha }}
{{- $unknown := printf "%s.filter(k, !(k in %s))" .value (toJson $allowed) -}}
(type({{ .value }}) != map ? "{{ $path }}: must be an object, got " + {{ include "dractl.cel.typename" .value }} : size({{ $unknown }}) == 0 ? "" : "{{ $path }}." + {{ $unknown }}.min() + ": unknown field (allowed: {{ join ", " $allowed }})")
{{- end }}

{{/* Python's repr of a CEL string expression (used where the value is known to be a string). */}}
{{- define "dractl.cel.strrepr" -}}
({{ . }}.contains("'") && !{{ . }}.contains('"') ? '"' + {{ . }}.replace('\\', '\\\\') + '"' : "'" + {{ . }}.replace('\\', '\\\\').replace("'", "\\'") + "'")
{{- end }}

{{/* The text the agent parses a quantity from: the string, or the number's digits ("" for other types). */}}
{{- define "dractl.cel.text" -}}
(type({{ . }}) == string ? {{ . }} : type({{ . }}) == int || type({{ . }}) == double ? string({{ . }}) : "")
{{- end }}

{{/*
The agent's quantity check for an MPS memory limit (`_limit_mib`), as CEL giving "" or "<message>".
Arguments: value (CEL of the value), text (CEL of its "dractl.cel.text").
*/}}
{{- define "dractl.cel.limit" -}}
(!(type({{ .value }}) == string || type({{ .value }}) == int || type({{ .value }}) == double) ? "must be a quantity string such as \"40Gi\", got " + {{ include "dractl.cel.typename" .value }} : !isQuantity({{ .text }}) ? (size({{ .text }}) <= 64 ? {{ include "dractl.cel.strrepr" .text }} : {{ include "dractl.cel.strrepr" (printf "%s.substring(0, 40)" .text) }} + "... (" + string(size({{ .text }})) + " characters)") + " is not a quantity (expected a number with an optional suffix such as Ki, Mi, Gi, m, k, M, G)" : quantity({{ .text }}).isLessThan(quantity("1Mi")) ? "must be at least 1Mi, got " + {{ .text }} : "")
{{- end }}

{{/* The node agent's nodeSelector as YAML ("" for none): nodeAgent.nodeSelector when set, else GPU nodes for nvml
and every node for fake. A default in values.yaml would be merged with the user's map, never replaced by it. */}}
{{- define "dractl.nodeAgentSelector" -}}
{{- $n := .Values.nodeAgent }}
{{- if kindIs "map" $n.nodeSelector }}
{{- with $n.nodeSelector }}{{ toYaml . }}{{ end }}
{{- else if eq $n.deviceSource "nvml" }}
{{- toYaml (dict "nvidia.com/gpu.present" "true") }}
{{- end }}
{{- end }}
