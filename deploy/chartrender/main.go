// echokv-chart-render renders a Helm chart offline, the way `helm template` does,
// so CI can check deploy/helm/echokv without Helm or a cluster.
//
//	echokv-chart-render --chart deploy/helm/echokv [-f values.yaml]... \
//	    [--name echokv] [--namespace default] [--kube-version 1.29.0] \
//	    [--api-versions monitoring.coreos.com/v1]... [--notes FILE] [--output FILE]
//
// What it mimics (Helm 3, pkg/engine + pkg/chartutil + pkg/releaseutil):
//   - values: the chart's values.yaml coalesced with the -f files (later files win,
//     maps merge, a null removes a default), every number a float64 as Helm's
//     sigs.k8s.io/yaml decoding gives (so `{{ .Values.n }}` of 4000000 is 4e+06);
//   - values.schema.json checked with xeipuuv/gojsonschema, Helm's validator;
//   - Chart.yaml's kubeVersion checked against --kube-version;
//   - .Values .Release .Chart .Capabilities .Files .Template; sprig's functions
//     without env/expandenv; include, tpl, required, toYaml, fromYaml, toJson,
//     fromJson, lookup (always empty, as in `helm template`); fail (sprig);
//     missingkey=zero and "<no value>" erased;
//   - output: documents split on "---", parsed as YAML (a parse error fails), sorted
//     in Helm's install order by kind, hooks (test Pods included) last, each with a
//     "# Source:" comment; NOTES.txt rendered separately (--notes).
//
// The differences from real Helm are listed in docs/DEPLOY.md ("How the chart is
// checked"). Build with Debian's Go packages, offline (GOPATH mode):
//
//	GO111MODULE=off GOPATH=/usr/share/gocode GOPROXY=off go build -o echokv-chart-render .
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"
)

// multiFlag collects a repeatable string flag.
type multiFlag []string

func (m *multiFlag) String() string { return strings.Join(*m, ",") }
func (m *multiFlag) Set(v string) error {
	*m = append(*m, v)
	return nil
}

func main() {
	os.Exit(run(os.Args[1:]))
}

func run(args []string) int {
	fs := flag.NewFlagSet("echokv-chart-render", flag.ContinueOnError)
	chartDir := fs.String("chart", "", "chart directory (holds Chart.yaml)")
	var valueFiles, apiVersions multiFlag
	fs.Var(&valueFiles, "f", "values file (repeatable; later files win)")
	fs.Var(&valueFiles, "values", "same as -f")
	releaseName := fs.String("name", "echokv", "release name")
	namespace := fs.String("namespace", "default", "release namespace")
	kubeVersion := fs.String("kube-version", DefaultKubeVersion, "Kubernetes version for .Capabilities.KubeVersion")
	fs.Var(&apiVersions, "api-versions", "extra API version for .Capabilities.APIVersions (repeatable)")
	isUpgrade := fs.Bool("is-upgrade", false, "set .Release.IsUpgrade instead of .Release.IsInstall")
	notesFile := fs.String("notes", "", "write the rendered NOTES.txt here")
	outFile := fs.String("output", "", "write the manifests here instead of stdout")
	skipTests := fs.Bool("skip-tests", false, "leave out test hooks, as helm template --skip-tests")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *chartDir == "" || fs.NArg() != 0 {
		fmt.Fprintln(os.Stderr, "usage: echokv-chart-render --chart DIR [-f values.yaml]... [flags]")
		return 2
	}
	out, notes, err := RenderChart(Options{
		ChartDir:    *chartDir,
		ValueFiles:  valueFiles,
		ReleaseName: *releaseName,
		Namespace:   *namespace,
		KubeVersion: *kubeVersion,
		APIVersions: apiVersions,
		IsUpgrade:   *isUpgrade,
		SkipTests:   *skipTests,
	})
	if err != nil {
		fmt.Fprintf(os.Stderr, "Error: %v\n", err)
		return 1
	}
	if *notesFile != "" {
		if err := os.WriteFile(*notesFile, []byte(notes), 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "Error: %v\n", err)
			return 1
		}
	}
	if *outFile != "" {
		if err := os.WriteFile(*outFile, []byte(out), 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "Error: %v\n", err)
			return 1
		}
		return 0
	}
	fmt.Print(out)
	return 0
}
