package org.elasticsearch.node;

import org.elasticsearch.env.Environment;
import org.elasticsearch.plugins.ClasspathPluginsService;
import org.elasticsearch.plugins.Plugin;
import org.elasticsearch.plugins.PluginsLoader;
import org.elasticsearch.plugins.PluginsService;

import java.util.List;

/**
 * A node whose plugins are plain classes on the classpath instead of plugin bundles on disk.
 *
 * <p>Lives in this package only because {@link NodeConstruction} and {@link NodeServiceProvider}
 * are package-private; everything else is the stock {@link Node}.
 */
public final class ClasspathNode extends Node {

    public ClasspathNode(Environment environment, List<Class<? extends Plugin>> plugins) {
        super(NodeConstruction.prepareConstruction(environment, null, new PluginsFromClasspath(plugins), true));
    }

    private static final class PluginsFromClasspath extends NodeServiceProvider {
        private final List<Class<? extends Plugin>> plugins;

        PluginsFromClasspath(List<Class<? extends Plugin>> plugins) {
            this.plugins = List.copyOf(plugins);
        }

        @Override
        PluginsService newPluginService(Environment environment, PluginsLoader ignored) {
            return new ClasspathPluginsService(environment.settings(), environment.configDir(), plugins);
        }
    }
}
