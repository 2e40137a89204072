package org.elasticsearch.plugins;

import org.elasticsearch.Build;
import org.elasticsearch.action.admin.cluster.node.info.PluginsAndModules;
import org.elasticsearch.common.settings.Settings;
import org.elasticsearch.plugins.spi.SPIClassIterator;

import java.lang.reflect.Constructor;
import java.nio.file.Path;
import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import java.util.Set;

/**
 * Plugins service for a node whose plugins (and the server itself) share one class loader.
 *
 * <ul>
 *   <li>plugins are instantiated from the given classes, no bundles are read from disk;</li>
 *   <li>SPI providers ({@code loadServiceProviders}) are looked up once on the shared class loader,
 *       so the server's own providers (e.g. its {@code FeatureSpecification}s) are found exactly once.</li>
 * </ul>
 *
 * <p>In this package only because {@link LoadedPlugin} and the reflective helpers of
 * {@link PluginsService} are package-private.
 */
public final class ClasspathPluginsService extends PluginsService {

    private final List<LoadedPlugin> loaded;
    private final PluginsAndModules info;

    public ClasspathPluginsService(Settings settings, Path configDir, List<Class<? extends Plugin>> pluginClasses) {
        super(settings, configDir, new PluginsLoader(Set.of(), Set.of(), Map.of()));
        List<LoadedPlugin> plugins = new ArrayList<>();
        for (Class<? extends Plugin> pluginClass : pluginClasses) {
            Plugin instance = loadPlugin(pluginClass, settings, configDir);
            plugins.add(new LoadedPlugin(describe(pluginClass), instance, pluginClass.getClassLoader()));
        }
        this.loaded = List.copyOf(plugins);
        this.info = new PluginsAndModules(loaded.stream().map(p -> new PluginRuntimeInfo(p.descriptor())).toList(), List.of());
    }

    private static PluginDescriptor describe(Class<? extends Plugin> pluginClass) {
        return new PluginDescriptor(
            pluginClass.getSimpleName(),
            "classpath plugin of es-dev",
            Build.current().version(),
            Build.current().version(),
            Integer.toString(Runtime.version().feature()),
            pluginClass.getName(),
            null,
            List.of(),
            false,
            false,
            false,
            false,
            PluginDescriptor.DeploymentTarget.ALL
        );
    }

    @Override
    protected List<LoadedPlugin> plugins() {
        return loaded;
    }

    @Override
    public PluginsAndModules info() {
        return info;
    }

    @Override
    public <T> List<? extends T> loadServiceProviders(Class<T> service) {
        List<T> providers = new ArrayList<>();
        SPIClassIterator<T> classes = SPIClassIterator.get(service, ClasspathPluginsService.class.getClassLoader());
        while (classes.hasNext()) {
            Class<? extends T> provider = classes.next();
            Plugin owner = ownerFor(provider);
            if (owner != null) {
                providers.add(createExtension(provider, service, owner));
            }
        }
        return List.copyOf(providers);
    }

    /**
     * The plugin to hand to a provider's constructor: any plugin for a no-arg constructor, else the
     * first plugin whose type the one-arg constructor accepts (null: the provider belongs to no
     * loaded plugin and is skipped).
     */
    private Plugin ownerFor(Class<?> provider) {
        Plugin anyPlugin = loaded.isEmpty() ? null : loaded.get(0).instance();
        Plugin owner = null;
        boolean noArg = false;
        for (Constructor<?> constructor : provider.getConstructors()) {
            if (constructor.getParameterCount() == 0) {
                noArg = true;
            } else if (constructor.getParameterCount() == 1) {
                for (LoadedPlugin plugin : loaded) {
                    if (owner == null && constructor.getParameterTypes()[0].isInstance(plugin.instance())) {
                        owner = plugin.instance();
                    }
                }
                if (owner == null) {
                    return null;
                }
            }
        }
        return owner != null ? owner : (noArg ? anyPlugin : null);
    }
}
