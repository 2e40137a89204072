package esfuse.esdev;

import org.elasticsearch.Build;
import org.elasticsearch.client.internal.node.NodeClient;
import org.elasticsearch.cluster.node.DiscoveryNodes;
import org.elasticsearch.cluster.service.ClusterService;
import org.elasticsearch.features.NodeFeature;
import org.elasticsearch.index.IndexVersion;
import org.elasticsearch.plugins.ActionPlugin;
import org.elasticsearch.plugins.Plugin;
import org.elasticsearch.rest.BaseRestHandler;
import org.elasticsearch.rest.RestHandler;
import org.elasticsearch.rest.RestRequest;
import org.elasticsearch.rest.RestResponse;
import org.elasticsearch.rest.RestStatus;
import org.elasticsearch.xcontent.XContentBuilder;

import java.io.IOException;
import java.util.Collection;
import java.util.List;
import java.util.concurrent.atomic.AtomicReference;
import java.util.function.Predicate;
import java.util.function.Supplier;

/**
 * Serves {@code GET /} and {@code HEAD /} with the standard "main" response (the rest-root module of
 * the Elasticsearch distribution does this; it is not published on Maven Central). Clients read it
 * for {@code info()} and {@code ping()}.
 */
public class RootInfoPlugin extends Plugin implements ActionPlugin {

    private final AtomicReference<ClusterService> clusterService = new AtomicReference<>();

    @Override
    public Collection<?> createComponents(PluginServices services) {
        clusterService.set(services.clusterService());
        return List.of();
    }

    @Override
    public Collection<RestHandler> getRestHandlers(
        RestHandlersServices services,
        Supplier<DiscoveryNodes> nodesInCluster,
        Predicate<NodeFeature> clusterSupportsFeature
    ) {
        return List.of(new RootHandler(clusterService));
    }

    static final class RootHandler extends BaseRestHandler {
        private final AtomicReference<ClusterService> clusterService;

        RootHandler(AtomicReference<ClusterService> clusterService) {
            this.clusterService = clusterService;
        }

        @Override
        public String getName() {
            return "esdev_root_info";
        }

        @Override
        public List<Route> routes() {
            return List.of(new Route(RestRequest.Method.GET, "/"), new Route(RestRequest.Method.HEAD, "/"));
        }

        @Override
        protected RestChannelConsumer prepareRequest(RestRequest request, NodeClient client) {
            return channel -> channel.sendResponse(new RestResponse(RestStatus.OK, body(channel.newBuilder())));
        }

        private XContentBuilder body(XContentBuilder out) throws IOException {
            ClusterService cluster = clusterService.get();
            Build build = Build.current();
            out.startObject();
            out.field("name", cluster.getNodeName());
            out.field("cluster_name", cluster.getClusterName().value());
            out.field("cluster_uuid", cluster.state().metadata().clusterUUID());
            out.startObject("version");
            out.field("number", build.qualifiedVersion());
            out.field("build_flavor", build.flavor());
            out.field("build_type", build.type().displayName());
            out.field("build_hash", build.hash());
            out.field("build_date", build.date());
            out.field("build_snapshot", build.isSnapshot());
            out.field("lucene_version", IndexVersion.current().luceneVersion().toString());
            out.field("minimum_wire_compatibility_version", build.minWireCompatVersion());
            out.field("minimum_index_compatibility_version", build.minIndexCompatVersion());
            out.endObject();
            out.field("tagline", "You Know, for Search");
            return out.endObject();
        }
    }
}
