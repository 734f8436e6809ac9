package lbmodel

import (
	"strings"
	"testing"
)

func TestValidateClass(t *testing.T) {
	tests := []struct {
		class   string
		wantErr string
	}{
		{class: ClassL4},
		{class: "example.com/internal-vip"},
		{class: "internal-vip"}, // unprefixed: reserved for end users, yet valid
		{class: "", wantErr: "must not be empty"},
		{class: "ebb.dev/", wantErr: `"ebb.dev/" is not a label-style key such as ebb.dev/l4`},
		{class: "ebb.dev/L4 fast", wantErr: "is not a label-style key"},
		{class: "a/b/c", wantErr: "is not a label-style key"},
	}
	for _, tt := range tests {
		t.Run(tt.class, func(t *testing.T) {
			err := ValidateClass(tt.class)
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("error %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, tt.wantErr)
			}
		})
	}
}
