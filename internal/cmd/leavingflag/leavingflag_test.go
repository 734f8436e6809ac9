package leavingflag

import (
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/spf13/pflag"

	"github.com/ebbdev/ebb/internal/lbmodel"
)

func TestFlag(t *testing.T) {
	dir := t.TempDir()
	write := func(name, text string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write("good", "# ours\ntaint:example.com/upgrade\nlabel:example.com/retiring=true\n")
	bad := write("bad", "taint:karpenter.sh/disrupted\ntaint:node.kubernetes.io/unschedulable\n")
	tests := []struct {
		name    string
		args    []string
		want    []lbmodel.LeavingSignal
		wantErr string
	}{
		{name: "unset keeps the defaults (nil)", args: nil, want: nil},
		{name: "a file", args: []string{"--" + Name, good}, want: []lbmodel.LeavingSignal{
			{Kind: lbmodel.SignalTaint, Key: "example.com/upgrade"},
			{Kind: lbmodel.SignalLabel, Key: "example.com/retiring", Value: "true"},
		}},
		{name: "a bad file stops the start, naming the line", args: []string{"--" + Name, bad}, wantErr: bad + `: leaving signal on line 2 ("taint:node.kubernetes.io/unschedulable")`},
		{name: "a missing file (the optional ConfigMap deleted) means the defaults", args: []string{"--" + Name, filepath.Join(dir, "none")}, want: nil},
		{name: "an unreadable path", args: []string{"--" + Name, dir}, wantErr: "reading the leaving signals"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := pflag.NewFlagSet("test", pflag.ContinueOnError)
			var got []lbmodel.LeavingSignal
			Add(fs, &got)
			err := fs.Parse(tt.args)
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			// nil (the defaults) is not an empty list (only ebb's own).
			if (got == nil) != (tt.want == nil) || !slices.Equal(got, tt.want) {
				t.Errorf("got %#v, want %#v", got, tt.want)
			}
		})
	}
}
