package main

// Tests of the Helm behaviour echokv-chart-render mimics, each on a small chart
// written to a temporary directory. The expected outputs are what Helm 3 renders
// for the same chart (its documented semantics: float64 values, coalescing, include,
// tpl, required, fail, missingkey=zero, install order, hooks).

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// writeChart creates a chart named "c" with the given files (path -> content);
// Chart.yaml is added unless given.
func writeChart(t *testing.T, files map[string]string) string {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "c")
	if _, ok := files["Chart.yaml"]; !ok {
		files["Chart.yaml"] = "apiVersion: v2\nname: c\nversion: 0.1.0\nappVersion: \"1.0\"\n"
	}
	for name, content := range files {
		p := filepath.Join(dir, filepath.FromSlash(name))
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func writeFile(t *testing.T, content string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "values.yaml")
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func renderOK(t *testing.T, o Options) string {
	t.Helper()
	if o.ReleaseName == "" {
		o.ReleaseName = "rel"
	}
	if o.Namespace == "" {
		o.Namespace = "ns"
	}
	if o.KubeVersion == "" {
		o.KubeVersion = DefaultKubeVersion
	}
	out, _, err := RenderChart(o)
	if err != nil {
		t.Fatalf("render failed: %v", err)
	}
	return out
}

func renderErr(t *testing.T, o Options) string {
	t.Helper()
	if o.KubeVersion == "" {
		o.KubeVersion = DefaultKubeVersion
	}
	_, _, err := RenderChart(o)
	if err == nil {
		t.Fatalf("render succeeded; an error was expected")
	}
	return err.Error()
}

// A ConfigMap template printing `expr` under data.v.
func cm(expr string) string {
	return "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\ndata:\n  v: " + expr + "\n"
}

func TestValuesAreFloat64LikeHelm(t *testing.T) {
	// The bug of the old chart: Helm decodes 4000000 as float64 and prints 4e+06.
	dir := writeChart(t, map[string]string{
		"values.yaml":      "num: 4000000\nbig: 17179869184\n",
		"templates/a.yaml": cm(`"{{ .Values.num }} {{ int64 .Values.num }} {{ .Values.big }} {{ printf "%d" (int64 .Values.big) }}"`),
		"templates/b.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: y\ndata:\n  {{- toYaml (dict \"num\" (toString .Values.num)) | nindent 2 }}\n",
	})
	out := renderOK(t, Options{ChartDir: dir})
	if !strings.Contains(out, `v: "4e+06 4000000 1.7179869184e+10 17179869184"`) {
		t.Errorf("float64 printing differs from Helm's:\n%s", out)
	}
	if !strings.Contains(out, `num: "4e+06"`) {
		t.Errorf("toString of a float64 should be 4e+06 as in Helm:\n%s", out)
	}
}

func TestToYamlPrintsIntegralNumbersPlainly(t *testing.T) {
	dir := writeChart(t, map[string]string{
		"values.yaml":      "m:\n  b: 4000000\n  a: x\n  c: \"yes\"\n",
		"templates/a.yaml": "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\ndata:\n  {{- toYaml .Values.m | nindent 2 }}\n",
	})
	out := renderOK(t, Options{ChartDir: dir})
	// sigs.k8s.io/yaml: JSON first (4000000), keys sorted, YAML 1.1 keywords quoted.
	want := "data:\n  a: x\n  b: 4000000\n  c: \"yes\"\n"
	if !strings.Contains(out, want) {
		t.Errorf("toYaml output:\n%s\nwant it to contain:\n%s", out, want)
	}
}

func TestCoalesceAndMerge(t *testing.T) {
	dir := writeChart(t, map[string]string{
		"values.yaml":      "a:\n  b: 1\n  c: 2\nd: 3\ne: [1, 2]\n",
		"templates/a.yaml": cm(`"{{ .Values.a.b }},{{ .Values.a.c }},{{ hasKey .Values "d" }},{{ .Values.e }},{{ .Values.f }}"`),
	})
	f1 := writeFile(t, "a:\n  b: 5\nd: null\ne: [9]\nf: one\n")
	f2 := writeFile(t, "f: two\n")
	out := renderOK(t, Options{ChartDir: dir, ValueFiles: []string{f1, f2}})
	// User maps merge into defaults, null deletes a default, lists replace, later
	// files win.
	if !strings.Contains(out, `v: "5,2,false,[9],two"`) {
		t.Errorf("coalesced values differ from Helm's:\n%s", out)
	}
}

func TestIncludeTplRequired(t *testing.T) {
	dir := writeChart(t, map[string]string{
		"values.yaml":            "name: world\ngreeting: \"hello {{ .Values.name }}\"\n",
		"templates/_helpers.tpl": `{{- define "c.x" -}}[{{ .Values.name }}]{{- end }}`,
		"templates/a.yaml":       cm(`"{{ include "c.x" . }} {{ tpl .Values.greeting . }} {{ required "need name" .Values.name }}"`),
	})
	out := renderOK(t, Options{ChartDir: dir})
	if !strings.Contains(out, `v: "[world] hello world world"`) {
		t.Errorf("include/tpl/required:\n%s", out)
	}
	// Partials are not rendered.
	if strings.Contains(out, "_helpers.tpl") {
		t.Errorf("a partial was rendered:\n%s", out)
	}
}

func TestRequiredAndFailMessages(t *testing.T) {
	dir := writeChart(t, map[string]string{
		"values.yaml":      "name: \"\"\n",
		"templates/a.yaml": cm(`{{ required "name is required" .Values.name }}`),
	})
	if msg := renderErr(t, Options{ChartDir: dir}); !strings.Contains(msg, "execution error at (c/templates/a.yaml:") ||
		!strings.HasSuffix(msg, "): name is required") {
		t.Errorf("required message: %q", msg)
	}
	dir = writeChart(t, map[string]string{
		"templates/_helpers.tpl": `{{- define "c.check" }}{{ fail "boom: bad value" }}{{ end }}`,
		"templates/a.yaml":       "{{ include \"c.check\" . }}\n",
	})
	if msg := renderErr(t, Options{ChartDir: dir}); !strings.HasSuffix(msg, "): boom: bad value") {
		t.Errorf("fail message through include: %q", msg)
	}
}

func TestMissingKeysRenderEmpty(t *testing.T) {
	dir := writeChart(t, map[string]string{
		"templates/a.yaml": cm(`"[{{ .Values.nope }}][{{ .Release.Nope }}]"`),
	})
	// Helm: missingkey=zero and "<no value>" erased.
	out := renderOK(t, Options{ChartDir: dir})
	if !strings.Contains(out, `v: "[][]"`) || strings.Contains(out, "no value") {
		t.Errorf("missing keys:\n%s", out)
	}
	// ... but a field of a missing map is an error, in Helm too.
	dir = writeChart(t, map[string]string{"templates/a.yaml": cm(`"{{ .Values.a.b }}"`)})
	if msg := renderErr(t, Options{ChartDir: dir}); !strings.Contains(msg, "nil pointer evaluating interface {}.b") {
		t.Errorf("field of a missing map: %q", msg)
	}
}

func TestEnvFunctionsAreRemoved(t *testing.T) {
	dir := writeChart(t, map[string]string{"templates/a.yaml": cm(`{{ env "HOME" }}`)})
	if msg := renderErr(t, Options{ChartDir: dir}); !strings.Contains(msg, `function "env" not defined`) {
		t.Errorf("env should not exist: %q", msg)
	}
}

func TestCapabilitiesAndLookup(t *testing.T) {
	dir := writeChart(t, map[string]string{
		"templates/a.yaml": cm(`"{{ .Capabilities.APIVersions.Has "apps/v1" }} {{ .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" }} {{ .Capabilities.KubeVersion.Version }} {{ semverCompare ">=1.27.0-0" .Capabilities.KubeVersion.Version }} {{ len (lookup "v1" "Secret" "ns" "s") }} {{ .Release.Namespace }} {{ .Release.IsInstall }} {{ .Chart.AppVersion }} {{ .Template.Name }}"`),
	})
	out := renderOK(t, Options{ChartDir: dir, KubeVersion: "1.26.3"})
	if !strings.Contains(out, `v: "true false v1.26.3 false 0 ns true 1.0 c/templates/a.yaml"`) {
		t.Errorf("capabilities (1.26):\n%s", out)
	}
	out = renderOK(t, Options{ChartDir: dir, APIVersions: []string{"monitoring.coreos.com/v1"}})
	if !strings.Contains(out, `v: "true true v1.29.0 true 0 ns true 1.0 c/templates/a.yaml"`) {
		t.Errorf("capabilities (1.29 + CRD):\n%s", out)
	}
}

func TestKubeVersionConstraint(t *testing.T) {
	dir := writeChart(t, map[string]string{
		"Chart.yaml":       "apiVersion: v2\nname: c\nversion: 0.1.0\nkubeVersion: \">=1.27.0-0\"\n",
		"templates/a.yaml": cm("x"),
	})
	msg := renderErr(t, Options{ChartDir: dir, KubeVersion: "1.26.0"})
	if !strings.Contains(msg, "chart requires kubeVersion: >=1.27.0-0 which is incompatible with Kubernetes v1.26.0") {
		t.Errorf("kubeVersion message: %q", msg)
	}
	renderOK(t, Options{ChartDir: dir, KubeVersion: "1.27.0"})
}

func TestSchemaValidation(t *testing.T) {
	schema := `{"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
	  "additionalProperties": false,
	  "properties": {"replicas": {"type": "integer", "minimum": 0}, "big": {"type": "integer"}}}`
	dir := writeChart(t, map[string]string{
		"values.yaml":        "replicas: 1\nbig: 4000000\n",
		"values.schema.json": schema,
		"templates/a.yaml":   cm("x"),
	})
	renderOK(t, Options{ChartDir: dir}) // 4000000 (a float64) is still an integer
	for values, want := range map[string]string{
		"replicas: \"3\"\n": "- replicas: Invalid type. Expected: integer, given: string",
		"replicas: -1\n":    "- replicas: Must be greater than or equal to 0",
		"replicas: 1.5\n":   "- replicas: Invalid type. Expected: integer, given: number",
		"replicsa: 1\n":     "Additional property replicsa is not allowed",
	} {
		msg := renderErr(t, Options{ChartDir: dir, ValueFiles: []string{writeFile(t, values)}})
		if !strings.Contains(msg, "values don't meet the specifications of the schema(s)") || !strings.Contains(msg, want) {
			t.Errorf("%q: got %q, want %q", values, msg, want)
		}
	}
}

func TestOrderHooksAndNotes(t *testing.T) {
	dir := writeChart(t, map[string]string{
		"templates/z-config.yaml":  cm("x"),
		"templates/a-sts.yaml":     "apiVersion: apps/v1\nkind: StatefulSet\nmetadata:\n  name: s\n",
		"templates/m-svc.yaml":     "apiVersion: v1\nkind: Service\nmetadata:\n  name: s\n---\n# only a comment\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: h\n",
		"templates/b-crd.yaml":     "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata:\n  name: m\n",
		"templates/tests/pod.yaml": "apiVersion: v1\nkind: Pod\nmetadata:\n  name: t\n  annotations:\n    helm.sh/hook: test\n",
		"templates/NOTES.txt":      "notes for {{ .Release.Name }}",
	})
	out, notes, err := RenderChart(Options{ChartDir: dir, ReleaseName: "r", Namespace: "n", KubeVersion: DefaultKubeVersion})
	if err != nil {
		t.Fatal(err)
	}
	var order []string
	for _, line := range strings.Split(out, "\n") {
		if strings.HasPrefix(line, "kind: ") {
			order = append(order, strings.TrimPrefix(line, "kind: "))
		}
	}
	// Install order by kind, unknown kinds (the CRD) after known ones, hooks last.
	want := "ConfigMap Service Service StatefulSet ServiceMonitor Pod"
	if strings.Join(order, " ") != want {
		t.Errorf("order %v, want %s\n%s", order, want, out)
	}
	if !strings.Contains(out, "---\n# Source: c/templates/tests/pod.yaml\n") {
		t.Errorf("no Source comment for the hook:\n%s", out)
	}
	if notes != "notes for r" || strings.Contains(out, "notes for") {
		t.Errorf("NOTES.txt: %q", notes)
	}
	out, _, err = RenderChart(Options{ChartDir: dir, KubeVersion: DefaultKubeVersion, SkipTests: true})
	if err != nil || strings.Contains(out, "kind: Pod") {
		t.Errorf("--skip-tests kept the test hook (err %v)", err)
	}
}

func TestYAMLErrorNamesTheTemplate(t *testing.T) {
	dir := writeChart(t, map[string]string{"templates/bad.yaml": "a: [1\n"})
	if msg := renderErr(t, Options{ChartDir: dir}); !strings.Contains(msg, "YAML parse error on c/templates/bad.yaml") {
		t.Errorf("YAML error: %q", msg)
	}
}

func TestHelmignoreAndFiles(t *testing.T) {
	dir := writeChart(t, map[string]string{
		".helmignore":      "*.bak\nsecret/\n",
		"files/a.txt":      "hello",
		"files/a.bak":      "ignored",
		"secret/key":       "ignored",
		"templates/a.yaml": cm(`"{{ .Files.Get "files/a.txt" }}|{{ .Files.Get "files/a.bak" }}|{{ .Files.Get "secret/key" }}"`),
	})
	out := renderOK(t, Options{ChartDir: dir})
	if !strings.Contains(out, `v: "hello||"`) {
		t.Errorf(".Files / .helmignore:\n%s", out)
	}
}

func TestTheEchokvChartRenders(t *testing.T) {
	out := renderOK(t, Options{ChartDir: "../helm/echokv"})
	for _, want := range []string{"kind: StatefulSet", "podManagementPolicy: Parallel", "clusterIP: None",
		"kind: PodDisruptionBudget", `service: "echokv.v1.EchoKV"`, "--replica_id=$(POD_NAME)"} {
		if !strings.Contains(out, want) {
			t.Errorf("the default render lacks %q", want)
		}
	}
}
