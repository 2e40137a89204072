package esfuse.esdev;

import org.apache.logging.log4j.LogManager;
import org.apache.logging.log4j.Logger;
import org.elasticsearch.common.logging.LogConfigurator;
import org.elasticsearch.common.settings.Settings;
import org.elasticsearch.env.Environment;
import org.elasticsearch.node.ClasspathNode;
import org.elasticsearch.node.InternalSettingsPreparer;
import org.elasticsearch.node.Node;
import org.elasticsearch.plugins.Plugin;
import org.elasticsearch.transport.netty4.Netty4Plugin;

import java.io.IOException;
import java.io.InputStream;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardCopyOption;
import java.util.List;
import java.util.Map;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.TimeUnit;

/**
 * Runs one Elasticsearch node in this JVM until SIGTERM.
 *
 * <p>Arguments are node settings as {@code -Ekey=value} (like the {@code elasticsearch} command);
 * {@code path.home}, {@code path.data} and {@code path.logs} are required. Logs go to the console,
 * which es-dev redirects to its log file.
 */
public final class EsDevMain {

    static final List<Class<? extends Plugin>> PLUGINS = List.of(Netty4Plugin.class, RootInfoPlugin.class, NGramPlugin.class);

    private EsDevMain() {}

    public static void main(String[] args) {
        try {
            run(settings(args));
        } catch (Throwable t) {
            System.err.println("es-dev: node failed to start");
            t.printStackTrace();
            System.err.flush();
            Runtime.getRuntime().halt(1);
        }
    }

    static Settings settings(String[] args) {
        Settings.Builder builder = Settings.builder()
            .put("cluster.name", "es-dev")
            .put("node.name", "es-dev")
            .put("discovery.type", "single-node")
            .put("network.host", "127.0.0.1")
            .put("http.port", "9200")
            .put("transport.port", "9300-9400")
            .put("cluster.routing.allocation.disk.threshold_enabled", false);
        for (String arg : args) {
            int eq = arg.indexOf('=');
            if (arg.startsWith("-E") == false || eq < 3) {
                throw new IllegalArgumentException("expected -Ekey=value, got [" + arg + "]");
            }
            builder.put(arg.substring(2, eq), arg.substring(eq + 1));
        }
        Settings settings = builder.build();
        for (String required : List.of("path.home", "path.data", "path.logs")) {
            if (settings.get(required) == null) {
                throw new IllegalArgumentException("missing -E" + required + "=...");
            }
        }
        return settings;
    }

    static void run(Settings settings) throws Exception {
        Path configDir = writeConfigDir(Path.of(settings.get("path.home")));
        LogConfigurator.registerErrorListener();
        LogConfigurator.setClusterName(settings.get("cluster.name"));
        LogConfigurator.setNodeName(settings.get("node.name"));
        Environment environment = InternalSettingsPreparer.prepareEnvironment(settings, Map.of(), configDir, () -> "es-dev");
        LogConfigurator.configure(environment, true);
        Logger logger = LogManager.getLogger(EsDevMain.class);

        Node node = new ClasspathNode(environment, PLUGINS);
        CountDownLatch stopped = new CountDownLatch(1);
        Runtime.getRuntime().addShutdownHook(new Thread(() -> stop(node, logger, stopped), "es-dev-shutdown"));
        node.start();
        logger.info("es-dev node started, http on {}:{}", settings.get("network.host"), settings.get("http.port"));
        stopped.await(); // keeps the JVM alive (node threads are daemons) until the shutdown hook ran
    }

    private static void stop(Node node, Logger logger, CountDownLatch stopped) {
        try {
            logger.info("es-dev node stopping");
            node.prepareForClose();
            node.close();
            if (node.awaitClose(20, TimeUnit.SECONDS) == false) {
                logger.warn("node did not close within 20s");
            }
            logger.info("es-dev node stopped");
        } catch (Exception e) {
            logger.error("error while stopping the node", e);
        } finally {
            LogManager.shutdown();
            stopped.countDown();
        }
    }

    /** config/ holds only our log4j2.properties (ES reads every log4j2.properties under it). */
    private static Path writeConfigDir(Path home) throws IOException {
        Path configDir = home.resolve("config");
        Files.createDirectories(configDir);
        try (InputStream in = EsDevMain.class.getResourceAsStream("/esdev-log4j2.properties")) {
            if (in == null) {
                throw new IllegalStateException("esdev-log4j2.properties missing from the classpath");
            }
            Files.copy(in, configDir.resolve("log4j2.properties"), StandardCopyOption.REPLACE_EXISTING);
        }
        return configDir;
    }
}
