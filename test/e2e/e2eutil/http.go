package e2eutil

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"

	"github.com/ebbdev/ebb/internal/localcluster/podserver"
)

// GetIdentity sends GET url through client and decodes the echo pod's
// answer; a status other than 200 is an error.
func GetIdentity(ctx context.Context, client *http.Client, url string) (podserver.Identity, error) {
	var id podserver.Identity
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return id, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return id, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return id, fmt.Errorf("GET %s: status %d", url, resp.StatusCode)
	}
	return id, json.NewDecoder(resp.Body).Decode(&id)
}
